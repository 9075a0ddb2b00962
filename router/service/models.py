"""The live router's view of node models: `ModelShape` and the models built from it live in the control core
(`evolving_infra.router.core.models`); this module re-exports the shape for the service's callers.

Boundary: re-export only.
"""

from evolving_infra.router.core.models import ModelShape

__all__ = ["ModelShape"]
