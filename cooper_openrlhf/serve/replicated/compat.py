"""Ray Serve 2.55 on protobuf 7: the fix Ray made upstream (ray-project/ray#64362), applied where Serve runs.

protobuf 7's upb backend removed `FieldDescriptor.label`; Serve 2.55's `_proto_to_dict`
(`ray/serve/_private/config.py`) still reads it, so every `serve.run` fails in the controller with
"'FieldDescriptor' object has no attribute 'label'" (ray-project/ray#64710). The pinned stack has both. The
replacement below is that function with upstream's test (`is_repeated`, else the old label), installed in the
driver and, through Ray's `worker_process_setup_hook` (`RUNTIME_ENV`), in every worker of the job: Serve's
controller, proxy and replicas are workers of the job that starts them. It goes once Ray ships the fix.
"""

from google.protobuf.descriptor import FieldDescriptor

SETUP_HOOK = "cooper_openrlhf.serve.replicated.compat.setup_worker"
RUNTIME_ENV = {"worker_process_setup_hook": SETUP_HOOK}


def _is_repeated(field) -> bool:
    is_repeated = getattr(field, "is_repeated", None)
    if is_repeated is not None:
        return is_repeated() if callable(is_repeated) else bool(is_repeated)
    return field.label == FieldDescriptor.LABEL_REPEATED


def proto_to_dict(proto) -> dict:
    """`ray.serve._private.config._proto_to_dict`, reading repetition as protobuf 7 exposes it."""
    data = {}
    for field, value in proto.ListFields():
        if _is_repeated(field):
            data[field.name] = [proto_to_dict(v) for v in value] if field.type == FieldDescriptor.TYPE_MESSAGE \
                else list(value)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            data[field.name] = proto_to_dict(value)
        else:
            data[field.name] = value
    return data


def _patch(config_module) -> None:
    config_module._proto_to_dict = proto_to_dict


def install() -> None:
    """Patch Serve's config module in this process, now or when it is first imported."""
    from cooper_openrlhf.runtime.cpu import after_import

    after_import("ray.serve._private.config", _patch)


def setup_worker() -> None:
    """The job's worker set-up: the CPU runtime (a no-op where CUDA is) and the patch above."""
    from cooper_openrlhf.runtime import cpu

    cpu.install()
    install()
