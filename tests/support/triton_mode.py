"""Marks for tests that run the Triton kernels on CPU tensors, i.e. in Triton's interpreter."""

import os

import pytest

# Triton picks interpreted or compiled kernels once per process, when the decorators run. conftest chooses the
# interpreter only without CUDA; with CUDA (`make test` on a GPU machine) the kernels are compiled, cannot take
# CPU tensors, and the tests marked gpu run them on the device instead.
needs_interpreter = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="runs Triton kernels on CPU tensors, which needs Triton's interpreter (TRITON_INTERPRET=1, chosen by "
           "conftest without CUDA); with CUDA the tests marked gpu run the kernels compiled")
