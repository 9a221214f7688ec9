"""fastrl's package layout; its metadata, dependencies, extras and commands are in pyproject.toml."""
from setuptools import find_packages, setup

setup(
    # kernels/ is a top-level folder of the repo but is installed as fastrl.kernels so that we
    # never install a top-level module called `kernels` (another PyPI package owns that name).
    packages=[*find_packages(include=["fastrl", "fastrl.*"]), "fastrl.kernels", "fastrl.profiles"],
    package_dir={"fastrl": "fastrl", "fastrl.kernels": "kernels", "fastrl.profiles": "profiles"},
    package_data={"fastrl.profiles": ["*.toml"]},
)
