"""The tests of tests/unit/test_doc_examples.py's subject that train in this process."""
import pytest

from fastrl.evaluation.export import export_run
from tests.unit.evaluation.test_export import have_onnx, small_config, untrained_run
from tests.unit.test_doc_examples import BLOCKS, ROOT, python_blocks, run_script

# The exported policy's blocks load the file without fastrl, as a deployment would.
WITHOUT_FASTRL = {"docs/evaluation.md"}

@pytest.mark.parametrize("page, index", BLOCKS, ids=[f"{page}-{i}" for page, i in BLOCKS])
def test_every_python_block_runs(page, index, tmp_path, request):
    code = python_blocks(ROOT / page)[index]
    if page in WITHOUT_FASTRL:
        if "onnxruntime" in code and not have_onnx():
            pytest.skip("onnxruntime is not installed (pip install 'fastrl[export]')")
        cwd = request.getfixturevalue("exported_policies")
    else:
        cwd = tmp_path
    result = run_script(code, cwd, without_fastrl=page in WITHOUT_FASTRL)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture
def exported_policies(tmp_path):
    """policy.pt and policy.onnx of a CartPole run in ``tmp_path``, as the export blocks load them."""
    run = tmp_path / "run"
    run.mkdir()
    untrained_run(run, small_config(**{"env.id": "CartPole-v1", "env.kwargs": {}}))
    export_run(run, "torchscript", tmp_path / "policy.pt")
    if have_onnx():
        export_run(run, "onnx", tmp_path / "policy.onnx")
    return tmp_path
