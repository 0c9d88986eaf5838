"""Accelerate's `commands.config.sagemaker` path: SageMaker configs are not supported."""

from __future__ import annotations

from ...unsupported.sagemaker import get_sagemaker_input

__all__ = ["get_sagemaker_input"]
