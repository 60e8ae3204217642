#!/usr/bin/env bash
# Build (and with PUSH=1 push) the launcher and runtime images: `make images`.
#   REGISTRY  image repository prefix          (default ghcr.io/mnnvl-pipelines)
#   TAG       image tag                         (default: the package version)
#   PUSH      1 pushes after building           (default 0: load into the local engine)
#   PLATFORMS e.g. linux/amd64,linux/arm64      (buildx only; default: the engine's own)
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

# The default base of a Dockerfile: `ARG BASE_IMAGE=…` and `ARG BASE_TAG=…`.
base_of() {
  local image tag
  image=$(sed -n 's/^ARG BASE_IMAGE=//p' "$1")
  tag=$(sed -n 's/^ARG BASE_TAG=//p' "$1")
  echo "$image:$tag"
}

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
  if [ "$BUILDX" = 1 ]; then
    if [ -n "${PLATFORMS:-}" ]; then args+=(--platform "$PLATFORMS"); fi
    if [ "$PUSH" = 1 ]; then args+=(--push); else args+=(--load); fi
    "$ENGINE" buildx build "${args[@]}" .
  else
    "$ENGINE" build "${args[@]}" .
    if [ "$PUSH" = 1 ]; then "$ENGINE" push "$ref"; fi
  fi
  echo "$ref"
}

build launcher "${LAUNCHER_BASE_DIGEST:-}"
build runtime "${RUNTIME_BASE_DIGEST:-}"
