#!/usr/bin/env bash
# Local stand-ins for the upstream images docker-compose.yml and
# example_project/Dockerfile name, built from Debian's package mirror, for machines
# that reach a Debian mirror but no image registry (CI). With a registry at hand,
# `docker compose pull` gets the real ones and this script is not needed.
#
#   tools/containers/build-base-images.sh      # as a user the Docker daemon accepts
#
# Images, each built only when no image of that name exists (so an upstream image
# already pulled is kept, and a second run does nothing):
#
#   debian:bookworm    `debootstrap --variant=minbase bookworm` from the mirror apt
#                      uses here (DEBIAN_MIRROR overrides it), plus this machine's
#                      site CAs (/usr/local/share/ca-certificates/*.crt), so that pip
#                      in an image trusts what it trusts here: the base of the two below.
#   redis:7            Debian's redis-server and redis-cli (7.0.x), started by a
#                      /usr/local/bin/redis-server wrapper that turns protected mode
#                      off as the upstream image does (its clients are other
#                      containers); WORKDIR and VOLUME /data, port 6379, runs as root
#                      (upstream drops to a redis user).
#   python:3.12-slim   Debian's python3 (3.11, not 3.12) in a virtual environment at
#                      /usr/local/venv whose bin/ leads PATH, so `python`, `pip install`
#                      and installed console scripts work as in the upstream image;
#                      ca-certificates (with the site CAs above) for pip to reach PyPI.
#
# They are stand-ins, not copies: same names and the same way of use, Debian's
# packages inside. Needs root (debootstrap) and a running Docker daemon.
set -euo pipefail

suite=bookworm
root=""  # the root filesystem being built, removed on every way out
trap 'if [ -n "$root" ]; then rm -rf "$root" "$root.log"; fi' EXIT

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

# docker build (Dockerfile on stdin, no context), quiet unless it fails; without
# buildx the CLI warns that the classic builder is deprecated: that line is dropped.
legacy_build() {
  local out
  if ! out=$(DOCKER_BUILDKIT=0 docker build -q --force-rm "$@" 2>&1); then
    echo "$out" >&2
    return 1
  fi
}

# The mirror apt uses on this machine: deb822 sources first, then sources.list.
debian_mirror() {
  local found=""
  if compgen -G "/etc/apt/sources.list.d/*.sources" >/dev/null; then
    found=$(awk -v s="$suite" '
      /^URIs:/ {uri=$2} /^Suites:/ {for (i = 2; i <= NF; i++) if ($i == s) hit=uri}
      /^$/ {if (hit) {print hit; exit}; uri=""; hit=""}
      END {if (hit) print hit}' /etc/apt/sources.list.d/*.sources | head -1)
  fi
  if [ -z "$found" ] && [ -f /etc/apt/sources.list ]; then
    found=$(awk -v s="$suite" '$1 == "deb" && $3 == s {print $2; exit}' /etc/apt/sources.list)
  fi
  echo "${found:-http://deb.debian.org/debian}"
}

build_debian() {
  local mirror
  mirror="${DEBIAN_MIRROR:-$(debian_mirror)}"
  root=$(mktemp -d /tmp/redlock-rootfs.XXXXXX)
  echo "== debian:$suite: debootstrap --variant=minbase from $mirror"
  if ! debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$root.log" 2>&1; then
    tail -20 "$root.log" >&2
    return 1
  fi
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  # This machine's site CAs (a TLS-inspecting egress proxy's, say): trusted in the
  # images that install ca-certificates, as they are here.
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    mkdir -p "$root/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  fi
  tar -C "$root" -c . | docker import -c 'CMD ["bash"]' - "debian:$suite" >/dev/null
  rm -rf "$root" "$root.log"
  root=""
}

build_redis() {
  echo "== redis:7: Debian's redis-server on debian:$suite"
  legacy_build -t redis:7 - <<DOCKERFILE
FROM debian:$suite
RUN apt-get update -qq \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server \\
 && rm -rf /var/lib/apt/lists/*
RUN printf '%s\n' '#!/bin/sh' \\
  '# Protected mode off, as in the upstream image; a config file stays the first argument.' \\
  'if [ \$# -gt 0 ] && [ "\${1#-}" = "\$1" ]; then conf=\$1; shift; exec /usr/bin/redis-server "\$conf" --protected-mode no "\$@"; fi' \\
  'exec /usr/bin/redis-server --protected-mode no "\$@"' >/usr/local/bin/redis-server \\
 && chmod 755 /usr/local/bin/redis-server && mkdir /data
WORKDIR /data
VOLUME /data
EXPOSE 6379
CMD ["redis-server"]
DOCKERFILE
}

build_python() {
  echo "== python:3.12-slim: Debian's python3 in a virtual environment on debian:$suite"
  legacy_build -t python:3.12-slim - <<DOCKERFILE
FROM debian:$suite
RUN apt-get update -qq \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3 python3-venv ca-certificates \\
 && rm -rf /var/lib/apt/lists/* \\
 && python3 -m venv /usr/local/venv
ENV PATH=/usr/local/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
CMD ["python3"]
DOCKERFILE
}

docker info >/dev/null 2>&1 || { echo "no Docker daemon answers (docker info failed)" >&2; exit 1; }
for image in "debian:$suite" redis:7 python:3.12-slim; do
  if have_image "$image"; then
    echo "== $image: present, kept"
    continue
  fi
  case "$image" in
    debian:*) build_debian ;;
    redis:*) build_redis ;;
    python:*) build_python ;;
  esac
done
