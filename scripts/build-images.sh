#!/usr/bin/env bash
# Build (and with PUSH=1 push) the launcher and runtime images: `make images`.
#   REGISTRY  image repository prefix          (default ghcr.io/mnnvl-pipelines)
#   TAG       image tag                         (default: the package version)
#   PUSH      1 pushes after building           (default 0: load into the local engine)
#   PLATFORMS e.g. linux/amd64,linux/arm64      (default: the engine's own). Several platforms
#             need buildx, and the classic image store cannot load them (`--load` refuses a
#             manifest list): with PUSH=1 they are pushed, with OCI_DIR written there, else they
#             stay in the build cache only.
#   OCI_DIR   without PUSH=1, writes each image as an OCI archive DIR/<name>.oci.tar (buildx)
#   LAUNCHER_BASE_DIGEST / RUNTIME_BASE_DIGEST  pin the bases; when empty, the current digest
#             of each base tag is resolved once and passed on (and so lands in the labels).
# Uses `docker buildx` when present, else `docker build`; CONTAINER_ENGINE=podman works too.
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINE=${CONTAINER_ENGINE:-docker}
VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' mnnvl/__init__.py)
REGISTRY=${REGISTRY:-ghcr.io/mnnvl-pipelines}
TAG=${TAG:-$VERSION}
PUSH=${PUSH:-0}
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ)

if ! command -v "$ENGINE" >/dev/null; then
  echo "error: no container engine: install docker (or set CONTAINER_ENGINE=podman)" >&2
  exit 2
fi
# Asked once, quietly: without a running engine every build below would fail with the same
# daemon error, printed again by each step.
if ! "$ENGINE" info >/dev/null 2>&1; then
  echo "error: no $ENGINE engine answers ($ENGINE info failed): start it (or set" \
    "CONTAINER_ENGINE=podman), or build where one runs (a CI job, a build VM):" \
    "make images REGISTRY=your.registry/ml TAG=x.y.z PUSH=1" >&2
  exit 2
fi
BUILDX=0
if "$ENGINE" buildx version >/dev/null 2>&1; then BUILDX=1; fi
MULTI=0
case "${PLATFORMS:-}" in *,*) MULTI=1 ;; esac
if [ "$BUILDX" = 0 ] && { [ "$MULTI" = 1 ] || [ -n "${OCI_DIR:-}" ]; }; then
  echo "error: several platforms (PLATFORMS=${PLATFORMS:-}) or OCI_DIR need docker buildx:" \
    "install the buildx plugin and run 'docker buildx create --use', or build one platform" \
    "at a time (PLATFORMS=linux/arm64)" >&2
  exit 2
fi
if [ "$MULTI" = 1 ] && [ "$PUSH" != 1 ] && [ -z "${OCI_DIR:-}" ]; then
  echo "note: PLATFORMS=$PLATFORMS without PUSH=1 or OCI_DIR leaves the images in the buildx" \
    "build cache only (docker's classic image store cannot load a multi-platform image):" \
    "add PUSH=1 to push them or OCI_DIR=DIR to write OCI archives" >&2
fi

# The default base of a Dockerfile: `ARG BASE_IMAGE=…` and `ARG BASE_TAG=…`.
base_of() {
  local image tag
  image=$(sed -n 's/^ARG BASE_IMAGE=//p' "$1")
  tag=$(sed -n 's/^ARG BASE_TAG=//p' "$1")
  echo "$image:$tag"
}

# A multi-arch base resolves to its index digest, so the pin holds for every platform built.
digest_of() {
  if [ "$BUILDX" = 1 ]; then
    "$ENGINE" buildx imagetools inspect "$1" --format '{{json .Manifest.Digest}}' | tr -d '"'
  else
    "$ENGINE" pull -q "$1" >/dev/null
    "$ENGINE" image inspect "$1" --format '{{index .RepoDigests 0}}' | sed 's/.*@//'
  fi
}

build() {
  local name=$1 digest=$2 dockerfile="images/$1.Dockerfile"
  local ref="$REGISTRY/$name:$TAG" base
  base=$(base_of "$dockerfile")
  if [ -z "$digest" ]; then digest=$(digest_of "$base"); fi
  echo "building $ref from $base@$digest" >&2
  local args=(-f "$dockerfile" -t "$ref"
    --build-arg "BASE_DIGEST=$digest" --build-arg "VERSION=$VERSION"
    --build-arg "REVISION=$REVISION" --build-arg "CREATED=$CREATED")
  if [ -n "${PLATFORMS:-}" ]; then args+=(--platform "$PLATFORMS"); fi
  if [ "$BUILDX" = 1 ]; then
    if [ "$PUSH" = 1 ]; then
      args+=(--push)
    elif [ -n "${OCI_DIR:-}" ]; then
      mkdir -p "$OCI_DIR"
      args+=(--output "type=oci,dest=$OCI_DIR/$name.oci.tar")
    elif [ "$MULTI" = 0 ]; then
      args+=(--load)
    fi
    "$ENGINE" buildx build "${args[@]}" .
  else
    "$ENGINE" build "${args[@]}" .
    if [ "$PUSH" = 1 ]; then "$ENGINE" push "$ref"; fi
  fi
  echo "$ref"
}

build launcher "${LAUNCHER_BASE_DIGEST:-}"
build runtime "${RUNTIME_BASE_DIGEST:-}"
