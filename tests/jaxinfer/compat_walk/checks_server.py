"""placeholder"""
from .registry import row_check  # noqa: F401
