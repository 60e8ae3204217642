"""The protobuf request bodies kubectl's ``create namespace`` and ``create serviceaccount`` send.

client-go's typed clients for built-in kinds send protobuf by default (``Request
.UseProtobufAsDefault``, kubernetes/client-go ``rest/request.go``, v0.32.4) and fall back to JSON
after a 415 only for CBOR (``requestClientContentConfigProvider.UnsupportedMediaType``,
``rest/client.go``), so answering 415 would not make kubectl retry in JSON. Every other kubectl
write (``apply``, ``create -f``, ``delete``, ``label``) goes through the dynamic client in JSON.

The simulated API server reads JSON; of protobuf it reads exactly what those two commands send:
the ``k8s\\0`` envelope (``runtime.Unknown``: typeMeta, raw) around a v1 Namespace or
ServiceAccount whose only set fields are its name and namespace (fields of
``k8s.io/api/core/v1/generated.proto`` and ``apimachinery/pkg/apis/meta/v1/generated.proto``:
object ``metadata`` = 1, ObjectMeta ``name`` = 1, ``namespace`` = 3). Anything else is refused with
the 415 kube-apiserver answers for a body it cannot decode (apimachinery
``runtime/serializer/negotiation`` ``errUnsupportedMediaType``), naming what it reads instead.
"""

from __future__ import annotations

from mnnvl.sim.api.model import ApiError, Obj

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"
KINDS = ("Namespace", "ServiceAccount")
Fields = list[tuple[int, int | bytes]]


def unsupported(detail: str) -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: "
        f"application/json (the simulated API server reads protobuf only for a v1 "
        f"{' or '.join(KINDS)} with just a name: {detail}; kubectl create -f and apply -f "
        "send JSON)",
    )


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(data):
            raise unsupported("truncated message")
        value |= (data[i] & 0x7F) << shift
        shift, i = shift + 7, i + 1
        if not data[i - 1] & 0x80:
            return value, i


def _fields(data: bytes) -> Fields:
    out: Fields = []
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        if key & 7 == 0:
            value, i = _varint(data, i)
            out.append((key >> 3, value))
        elif key & 7 == 2:
            size, i = _varint(data, i)
            if i + size > len(data):
                raise unsupported("truncated message")
            out.append((key >> 3, data[i : i + size]))
            i += size
        else:
            raise unsupported(f"wire type {key & 7}")
    return out


def _empty(value: int | bytes) -> bool:
    """A field holding its zero value: 0, "", or a message of zero values only (gogo-protobuf
    writes every non-pointer field, set or not)."""
    if not isinstance(value, bytes) or not value:
        return not value
    try:
        return all(_empty(v) for _, v in _fields(value))
    except ApiError:
        return False


def _only(data: bytes, wanted: dict[int, str], what: str) -> dict[str, bytes]:
    """A message's ``wanted`` fields (number -> name); any other field that is set is a 415."""
    out: dict[str, bytes] = {}
    for number, value in _fields(data):
        if number in wanted and isinstance(value, bytes):
            out[wanted[number]] = value
        elif not _empty(value):
            raise unsupported(f"{what} field {number} is set")
    return out


def _strings(data: bytes, wanted: dict[int, str], what: str) -> dict[str, str]:
    return {k: v.decode() for k, v in _only(data, wanted, what).items() if v}


def decode(body: bytes) -> Obj:
    """The JSON form of a protobuf Namespace or ServiceAccount with only a name (and namespace)."""
    if not body.startswith(MAGIC):
        raise unsupported("no k8s protobuf envelope")
    # runtime.Unknown around the object: its typeMeta, then the object's own bytes
    envelope = _only(body[len(MAGIC) :], {1: "typeMeta", 2: "raw"}, "envelope")
    kind = _strings(envelope.get("typeMeta", b""), {1: "apiVersion", 2: "kind"}, "typeMeta")
    if (kind.get("apiVersion"), kind.get("kind")) not in {("v1", k) for k in KINDS}:
        raise unsupported(f"got {kind.get('apiVersion')} {kind.get('kind')}")
    obj = _only(envelope.get("raw", b""), {1: "metadata"}, kind["kind"])
    meta = _strings(obj.get("metadata", b""), {1: "name", 3: "namespace"}, "metadata")
    return {**kind, "metadata": meta}
