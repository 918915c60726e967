# The cffi native module is built by setuptools from native/build_native.py (out-of-line API mode).
from setuptools import setup

setup(cffi_modules=["native/build_native.py:ffibuilder"])
