"""The MegatronJob API (megatron.dev/v1alpha1): models, recipes, loading, and the CRD."""

from .errors import FieldError, SpecError
from .job import API_VERSION, GROUP, KIND, PLURAL, VERSION, MegatronJob, ObjectMeta
from .loader import apply_overrides, load_file, load_job, parse_yaml, read_documents, read_file
from .spec import MegatronJobSpec
from .status import MegatronJobStatus

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "FieldError",
    "MegatronJob",
    "MegatronJobSpec",
    "MegatronJobStatus",
    "ObjectMeta",
    "SpecError",
    "apply_overrides",
    "load_file",
    "load_job",
    "parse_yaml",
    "read_documents",
    "read_file",
]
