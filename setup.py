"""fastrl: an asynchronous RL trainer for one machine, with optional multi-node learners."""
from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="fastrl",
    version="0.1.0",
    description="Asynchronous RL trainer for one machine (several through torchrun): shared-memory rollouts, "
    "central inference batching, V-trace and replay learners",
    long_description=(Path(__file__).parent / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="MIT",
    classifiers=[
        "Development Status :: 3 - Alpha",
        "Intended Audience :: Science/Research",
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    python_requires=">=3.10",
    # kernels/ is a top-level folder of the repo but is installed as fastrl.kernels so that we
    # never install a top-level module called `kernels` (another PyPI package owns that name).
    packages=[*find_packages(include=["fastrl", "fastrl.*"]), "fastrl.kernels", "fastrl.profiles"],
    package_dir={"fastrl": "fastrl", "fastrl.kernels": "kernels", "fastrl.profiles": "profiles"},
    package_data={"fastrl.profiles": ["*.toml"]},
    install_requires=[
        "numpy>=2.0",
        "numba>=0.60",
        "gymnasium>=1.0",
        "envpool>=1.2",
        # A range, not a pin: GPU users keep the CUDA build they already have.
        "torch>=2.1",
        "psutil>=5.9",
        # Caps numpy's BLAS at one thread in each child process (OpenBLAS, MKL or BLIS alike):
        # OpenBLAS's own pool would spin on the cores the envs need.
        "threadpoolctl>=3.1",
        "tomli>=2.0; python_version<'3.11'",
        "tomli-w>=1.0",
    ],
    extras_require={
        "test": ["pytest>=7", "ruff>=0.6"],
        "atari": ["ale-py>=0.9", "opencv-python-headless>=4.8"],
        # ViZDoom's gymnasium ids; OpenCV resizes the engine's smallest screen to env.resize.
        "vizdoom": ["vizdoom>=1.3", "opencv-python-headless>=4.8"],
        "tb": ["tensorboard>=2.10"],
        "replay": ["lz4>=4"],
        "plot": ["matplotlib>=3.7"],
        # fastrl-eval --video: imageio's FFMPEG writer runs the ffmpeg binary imageio-ffmpeg bundles.
        "video": ["imageio>=2.31", "imageio-ffmpeg>=0.4.9"],
        "wandb": ["wandb>=0.16"],
        # fastrl-export --format onnx: torch.onnx's exporter (onnx, onnxscript); onnxruntime runs the file.
        "export": ["onnx>=1.16", "onnxscript>=0.3", "onnxruntime>=1.18"],
        # fastrl-profile reads GPU use through NVML (no CUDA context, no nvidia-smi process per sample).
        "gpu": ["nvidia-ml-py>=12"],
        # --env pettingzoo:MODULE: PettingZoo's ParallelEnvs, and mpe2's particle worlds (simple_spread).
        "multiagent": ["pettingzoo>=1.25", "mpe2>=1.1", "openskill>=6"],
        # fastrl-sweep (Optuna's heartbeat retry as named since 4.9); `dashboard` adds the optional
        # optuna-dashboard that shows its study (optuna-dashboard sqlite:///SWEEP_DIR/sweep.db).
        "sweep": ["optuna>=4.9"],
        "dashboard": ["optuna>=4.9", "optuna-dashboard>=0.15"],
    },
    entry_points={
        "console_scripts": [
            "fastrl-train=fastrl.cli:train_main",
            "fastrl-eval=fastrl.cli:eval_main",
            "fastrl-export=fastrl.cli:export_main",
            "fastrl-profile=fastrl.cli:profile_main",
            "fastrl-plot=fastrl.cli:plot_main",
            "fastrl-sweep=fastrl.cli:sweep_main",
        ]
    },
)
