"""Small real and tiny offline models for CPU runs and tests, and where they live on disk."""

from cooper_openrlhf.models.paths import MODEL_NAMES, ModelNotMaterializedError, model_path, models_dir

__all__ = ["MODEL_NAMES", "ModelNotMaterializedError", "model_path", "models_dir"]
