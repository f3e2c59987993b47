#!/usr/bin/env bash
# Build the benchmark image from the repository's Dockerfile and run the workflow in it, on a
# machine without Docker, NVIDIA images or a GPU; then run the same workflow outside it.
#
# Usage (as root, or as a user who may run podman and sudo apt-get):
#
#     benchmarks/container_check.sh
#
# What it does, and prints:
#   1. installs podman, buildah, runc and debootstrap where absent (apt-get);
#   2. makes a local Debian 12 base image once: debootstrap --variant=minbase from the mirror apt
#      already uses, imported as $BASE_IMAGE; the root file system is cached as a tarball under
#      $CACHE_DIR (default /var/tmp/frcnn-dp-bench) so a later run imports it without network;
#   3. builds $IMAGE from the unchanged Dockerfile with the base as its CUDA_IMAGE build argument
#      (podman build --isolation chroot, the host's CA bundle mounted, pip's index passed in);
#      prints the build time and the image size;
#   4. runs "the tiny workflow" (the demo preset shrunk like tests/workflow.py's tiny_params,
#      in an edited copy of params.yaml in a temporary work directory) in the image as its
#      non-root user, mapped to the invoking user (--userns=keep-id rootless, --uidmap as root),
#      with results/, logs/, data/ and .snakemake/ mounted; checks that everything it wrote is
#      owned by the invoking user and readable by others (no 0600 files);
#   5. runs the same tiny workflow outside the container, straight after, with .venv, and prints
#      the wall-time ratio inside / outside.
# At the end dangling images (the build's intermediate layers) are pruned; the image stays.
#
# Environment (all optional):
#   IMAGE=frcnn-dp-bench:local   BASE_IMAGE=localbase:bookworm   CACHE_DIR=/var/tmp/frcnn-dp-bench
#   DEBIAN_MIRROR=<the host's>   NO_CACHE=1 (rebuild every layer)   KEEP_BUILD_CACHE=1 (no prune)
#   BUILD_TMPDIR=${TMPDIR:-/var/tmp} (where podman puts two temporary copies of a layer while
#   committing it, 13 GB for the lock's; another file system or a tmpfs when the disk is short)
# Disk: the image is about 7 GB; building it takes about 14 GB where podman keeps images
# (/var/lib/containers) and 13 GB in BUILD_TMPDIR, freed when the build ends.
#   KEEP_WORKDIR=1 (keep the temporary work directory and print where it is)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IMAGE=${IMAGE:-frcnn-dp-bench:local}
BASE_IMAGE=${BASE_IMAGE:-localbase:bookworm}
CACHE_DIR=${CACHE_DIR:-/var/tmp/frcnn-dp-bench}
HOST_PYTHON=$REPO/.venv/bin/python
CA_IN_BUILD=/tmp/host-ca-certificates.crt
SUDO=$([[ $(id -u) -eq 0 ]] && echo "" || echo sudo)

say() { printf '\n== %s\n' "$*"; }
die() { printf 'container_check: %s\n' "$*" >&2; exit 1; }
now() { date +%s.%N; }
seconds() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

[[ -x $HOST_PYTHON ]] || die "$HOST_PYTHON not found: create .venv first (README, Quick start)"

# --- 1. tools ---------------------------------------------------------------------------------
missing=()
for tool in podman buildah runc debootstrap; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]})); then
    say "installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
podman --version

# --- 2. the local base image ------------------------------------------------------------------
# The mirrors apt already uses (deb822 .sources or one-line .list), unless DEBIAN_MIRROR is set.
apt_uris() {
    cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list \
        2>/dev/null | grep -v '^\s*#' | grep -o -E 'https?://[^ ]+' || true
}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-$(apt_uris | grep -E '/debian/?$' | head -n1)}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=$(apt_uris | grep -E '/debian-security/?$' | head -n1)
SECURITY_MIRROR=${SECURITY_MIRROR:-http://deb.debian.org/debian-security}
BASE_TAR=$CACHE_DIR/bookworm-minbase.tar

if podman image exists "$BASE_IMAGE"; then
    say "base image $BASE_IMAGE exists (podman rmi it to remake it from $BASE_TAR)"
else
    if [[ -f $BASE_TAR ]]; then
        say "base image $BASE_IMAGE: importing the cached root file system $BASE_TAR"
    else
        say "base image $BASE_IMAGE: debootstrap --variant=minbase bookworm from $DEBIAN_MIRROR" \
            "(cached as $BASE_TAR)"
        mkdir -p "$CACHE_DIR"
        rootfs=$(mktemp -d "$CACHE_DIR/rootfs.XXXXXX")
        $SUDO debootstrap --variant=minbase bookworm "$rootfs" "$DEBIAN_MIRROR" >"$rootfs.log" 2>&1 \
            || { tail -n 20 "$rootfs.log" >&2; die "debootstrap failed (log: $rootfs.log)"; }
        # The sources the official debian:bookworm image has: release, updates and security.
        $SUDO rm -f "$rootfs/etc/apt/sources.list"
        $SUDO tee "$rootfs/etc/apt/sources.list.d/debian.sources" >/dev/null <<EOF
Types: deb
URIs: $DEBIAN_MIRROR
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY_MIRROR
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
        $SUDO rm -rf "$rootfs/var/cache/apt/archives/"*.deb "$rootfs/var/lib/apt/lists/"*
        $SUDO tar -C "$rootfs" -cf "$BASE_TAR.part" . && mv "$BASE_TAR.part" "$BASE_TAR"
        $SUDO rm -rf "$rootfs" "$rootfs.log"
    fi
    podman import --change 'CMD ["/bin/bash"]' "$BASE_TAR" "$BASE_IMAGE" >/dev/null
fi

# --- 3. build ---------------------------------------------------------------------------------
# pip's own settings on this machine: the environment first, then its configuration files.
pip_setting() {
    local env_name value
    env_name=PIP_$(tr 'a-z-' 'A-Z_' <<<"$1")
    value=${!env_name:-}
    [[ -n $value ]] || value=$("$HOST_PYTHON" -m pip config get "global.$1" 2>/dev/null) || true
    [[ -n $value ]] || value=$("$HOST_PYTHON" -m pip config get "install.$1" 2>/dev/null) || true
    echo "$value"
}
# The CA bundle pip trusts here (a TLS-intercepting proxy's CA may be in it) is mounted into every
# RUN step, and pip in the build is told to use it. Not at the image's own bundle path
# (/etc/ssl/certs/ca-certificates.crt): installing ca-certificates rewrites that file, which a
# mount makes fail. A mount is never part of a layer: the image keeps its own CAs.
CA_BUNDLE=$(pip_setting cert)
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
[[ -f $CA_BUNDLE ]] || die "CA bundle $CA_BUNDLE not found"
build_args=(--build-arg "CUDA_IMAGE=$BASE_IMAGE" --build-arg "PIP_CERT=$CA_IN_BUILD"
            --build-arg "GIT_REVISION=$(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo unknown)")
index=$(pip_setting index-url)
[[ -z $index ]] || build_args+=(--build-arg "PIP_INDEX_URL=$index")
# Extra indexes that are directories of this machine (file://) are not visible in the build.
extra=$(pip_setting extra-index-url | tr ' ' '\n' | grep -E '^https?://' | paste -sd' ' || true)
[[ -z $extra ]] || build_args+=(--build-arg "PIP_EXTRA_INDEX_URL=$extra")
[[ -z ${NO_CACHE:-} ]] || build_args+=(--no-cache)

# Committing a layer takes about four times its size at once, and the lock's layer is about
# 6 GB: the working copy and the stored layer where podman keeps images, and two temporary
# copies (buildah's and the image library's) in BUILD_TMPDIR.
BUILD_TMPDIR=${BUILD_TMPDIR:-${TMPDIR:-/var/tmp}}
graphroot=$(podman info --format '{{.Store.GraphRoot}}')
free_gb() { df -P --block-size=1G "$1" | awk 'NR == 2 { print $4 }'; }
fs() { df -P "$1" | awk 'NR == 2 { print $1 }'; }
echo "free: $(free_gb "$graphroot") GB for images ($graphroot)," \
     "$(free_gb "$BUILD_TMPDIR") GB for the build's temporary copies ($BUILD_TMPDIR)"
if [[ $(fs "$graphroot") == "$(fs "$BUILD_TMPDIR")" ]]; then
    short=$(($(free_gb "$graphroot") < 26))
else
    short=$(($(free_gb "$graphroot") < 14 || $(free_gb "$BUILD_TMPDIR") < 13))
fi
if ((short)); then
    echo "warning: the build may run out of space (it needs about 14 GB for images and 13 GB" \
         "of temporary copies); BUILD_TMPDIR can point to another file system or a tmpfs" \
         "(mount -t tmpfs -o size=13g tmpfs DIR)" >&2
fi

say "building $IMAGE on $BASE_IMAGE (pip index: ${index:-the default, PyPI}${extra:+; extra: $extra})"
build_log=$CACHE_DIR/build.log
mkdir -p "$CACHE_DIR"
start=$(now)
TMPDIR=$BUILD_TMPDIR podman build --isolation chroot --layers --force-rm \
    -v "$CA_BUNDLE:$CA_IN_BUILD:ro" \
    "${build_args[@]}" -t "$IMAGE" -f "$REPO/Dockerfile" "$REPO" >"$build_log" 2>&1 \
    || { tail -n 30 "$build_log" >&2; die "podman build failed (log: $build_log)"; }
build_s=$(seconds "$start" "$(now)")
cached=$(grep -c -- '--> Using cache' "$build_log" || true)
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
echo "build: ${build_s} s ($cached steps from the layer cache; log: $build_log)"
echo "image: $IMAGE, $(awk -v b="$size" 'BEGIN { printf "%.2f GB (%.0f bytes)", b / 1e9, b }')"

# --- 4. the tiny workflow inside the container ------------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/container-check.XXXXXX")
if [[ -n ${KEEP_WORKDIR:-} ]]; then
    echo "work directory (kept): $WORK"
else
    trap 'rm -rf "$WORK"' EXIT
fi
# The demo preset shrunk like tests/workflow.py's tiny_params (params.yaml is not changed).
"$HOST_PYTHON" - "$REPO" "$WORK/params.yaml" <<'PY'
import sys

import yaml

sys.path.insert(0, sys.argv[1])
from tests.workflow import tiny_params  # the one definition of the tiny workflow

raw = tiny_params(yaml.safe_load(open(f"{sys.argv[1]}/params.yaml")))
open(sys.argv[2], "w").write(yaml.safe_dump(raw, sort_keys=False))
PY

# The image's user (USER in the Dockerfile), mapped to the invoking user so that what it writes
# on the host is the invoker's: rootless podman does that with keep-id. Rootful podman has no
# keep-id, so the mapping is spelt out: the image's user is the invoker (root), the ids below it
# are shifted up by one (its root is uid 1 outside) and those above it stay. (Mapping them to an
# unused range instead, 100000 and up, made the overlay mount fail here with "permission
# denied".) Podman makes a copy of the image with its files' owners mapped on the first run
# (about the image's size on disk, kept with the image for later runs).
read -r image_uid image_gid < <(podman image inspect --format '{{.Config.User}}' "$IMAGE" | tr ':' ' ')
image_gid=${image_gid:-$image_uid}
[[ $image_uid =~ ^[0-9]+$ && $image_uid -ne 0 ]] || die "image user '$image_uid' is not a non-root uid"
if [[ $(id -u) -eq 0 ]]; then
    idmap() {  # $1: --uidmap or --gidmap, $2: the image's id; container:host:count
        echo "$1 0:1:$2 $1 $2:0:1 $1 $(($2 + 1)):$(($2 + 1)):$((65536 - $2 - 1))"
    }
    # shellcheck disable=SC2207
    userns=($(idmap --uidmap "$image_uid") $(idmap --gidmap "$image_gid") --user "$image_uid:$image_gid")
else
    userns=(--userns "keep-id:uid=$image_uid,gid=$image_gid" --user "$image_uid:$image_gid")
fi
mkdir -p "$WORK/container"/{results,logs,data,.snakemake}
cp "$WORK/params.yaml" "$WORK/container/params.yaml"
run=(podman run --rm --runtime runc --network none
     --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 "${userns[@]}"
     -v "$WORK/container/params.yaml:/workspace/params.yaml:ro")
for dir in results logs data .snakemake; do
    run+=(-v "$WORK/container/$dir:/workspace/$dir")
done

say "in the container: $("${run[@]}" "$IMAGE" sh -c 'echo "$(id -un) ($(id -u):$(id -g)), $(python --version)"')" \
    "mapped to $(id -un) ($(id -u):$(id -g)) on the host"
say "the tiny workflow inside the container"
start=$(now)
"${run[@]}" "$IMAGE" snakemake --cores all >"$WORK/container.log" 2>&1 \
    || { tail -n 40 "$WORK/container.log" >&2; die "the workflow failed in the container"; }
inside_s=$(seconds "$start" "$(now)")
echo "inside: ${inside_s} s"

# Every file and directory the container wrote is the invoker's, and readable by others.
not_mine=$(find "$WORK/container"/{results,logs} ! -user "$(id -u)" | wc -l)
unreadable=$(find "$WORK/container"/{results,logs} -type f ! -perm -044 | wc -l)
files=$(find "$WORK/container"/{results,logs} -type f | wc -l)
ls -ln "$WORK/container/results/summary/demo.csv" "$WORK/container/results/paper/demo/paper.pdf" \
    | sed "s|$WORK/||"
echo "ownership: $files files under results/ and logs/; $not_mine not owned by $(id -un)" \
     "(uid $(id -u)); $unreadable not readable by group and others"
((not_mine == 0 && unreadable == 0 && files > 0)) || die "ownership check failed"

# --- 5. the same workflow outside, straight after ---------------------------------------------
say "the same tiny workflow outside the container (.venv)"
mkdir -p "$WORK/host"
cp -r "$REPO"/{Snakefile,rules,dvc.yaml,pipeline,paper,.dvc,.dvcignore} "$WORK/host/"
cp "$WORK/params.yaml" "$WORK/host/params.yaml"
start=$(now)
(cd "$WORK/host" && PATH=$REPO/.venv/bin:$PATH snakemake --cores all) >"$WORK/host.log" 2>&1 \
    || { tail -n 40 "$WORK/host.log" >&2; die "the workflow failed outside the container"; }
outside_s=$(seconds "$start" "$(now)")
echo "outside: ${outside_s} s"

job_stats() {  # the "Job stats" table as "rule count, ..."
    awk '/^Job stats:/ { on = 1; next } on && /^total/ { exit }
         on && $2 ~ /^[0-9]+$/ { printf "%s%s %s", sep, $1, $2; sep = ", " }' "$1"
}
echo "jobs inside:  $(job_stats "$WORK/container.log")"
echo "jobs outside: $(job_stats "$WORK/host.log")"
awk -v i="$inside_s" -v o="$outside_s" \
    'BEGIN { printf "\nwall time inside / outside: %.1f s / %.1f s = %.2f\n", i, o, i / o }'

if [[ -z ${KEEP_BUILD_CACHE:-} ]]; then
    say "pruning dangling images (the build's intermediate layers); $IMAGE and $BASE_IMAGE stay"
    podman image prune -f >/dev/null
fi
podman images
