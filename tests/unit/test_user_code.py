"""Loading the user's MODULE:CALLABLE (fastrl/user_code.py): whatever stops the import is one line
naming the option, the module and the error's first line."""
import json

import pytest

from fastrl.user_code import load_callable
from tests.support import user_modules

WANTED = "fn(x) -> y"


@pytest.mark.parametrize("module, message", user_modules.BROKEN + [
    ("no_such_module_x", "cannot import 'no_such_module_x' (ModuleNotFoundError: No module named "
                         "'no_such_module_x'); correct the module name or put its directory on PYTHONPATH"),
])
def test_a_module_that_cannot_be_imported_is_one_line(tmp_path, monkeypatch, module, message):
    user_modules.install(tmp_path, monkeypatch)
    with pytest.raises(ValueError) as error:
        load_callable(f"{module}:fn", "the.option", WANTED)
    text = str(error.value)
    assert "\n" not in text and text.startswith(f"the.option '{module}:fn': ") and message in text, text


@pytest.mark.parametrize("spec, message", [
    ("json:no_such_fn", "the.option 'json:no_such_fn': module 'json' has no 'no_such_fn'; name a callable in it, "
                        "fn(x) -> y"),
    ("json:__name__", "the.option 'json:__name__' is not callable (type str); give fn(x) -> y"),
    ("json", "the.option 'json' is not MODULE:CALLABLE; give fn(x) -> y"),
    ("json:", "the.option 'json:' is not MODULE:CALLABLE"),
    (":dumps", "'' is not an absolute module name"),
])
def test_a_name_that_is_not_a_callable_is_one_line(spec, message):
    with pytest.raises(ValueError) as error:
        load_callable(spec, "the.option", WANTED)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_callers_error_class_is_raised_and_a_good_name_loads():
    class Mine(ValueError):
        pass

    with pytest.raises(Mine):
        load_callable("no_such_module_x:fn", "the.option", WANTED, Mine)
    assert load_callable("json:dumps", "the.option", WANTED) is json.dumps
