"""Packages: ``torchtitan_lite`` and the repo's top-level ``models/`` folder installed as
``torchtitan_lite.models`` (a name of ours: a user's own ``models`` package cannot shadow it). The
rest of the metadata is pyproject.toml's."""

from setuptools import find_packages, setup

MODELS = ["torchtitan_lite.models"] + [
    f"torchtitan_lite.models.{name}" for name in find_packages("models")
]

setup(
    packages=find_packages(include=["torchtitan_lite*"]) + MODELS,
    package_dir={"torchtitan_lite.models": "models"},
)
