#!/usr/bin/env bash
# Builds the backends lora_otel's tests run, natively and from their own Go modules:
#   otelcol-lora  from collector/otelcol-lora (our collector: the components collector/*.yaml use)
#   jaeger        from deploy/jaeger (Jaeger v2, github.com/jaegertracing/jaeger/cmd/jaeger v1.76.0)
# into build/backends/ (or $LORA_OTEL_BACKENDS_DIR) and prints one `name=path` line per binary.
# Cached: a binary is rebuilt only when its module's go.mod, go.sum or *.go or the Go version
# change (a second run takes well under a second). Go's module and build caches make a rebuild
# after a change take seconds to a minute; the first build on a fresh machine takes minutes
# (measured in README.md). Needs Go >= 1.26 and the Go module proxy; fails loudly without them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${LORA_OTEL_BACKENDS_DIR:-$root/build/backends}

if ! command -v go >/dev/null 2>&1; then
  echo "collector/build.sh: Go is not installed (or not on PATH): the collector and Jaeger are built from their Go modules; install Go >= 1.26 (https://go.dev/dl/, or Debian's golang package if it is new enough)" >&2
  exit 1
fi
if ! mkdir -p "$out" 2>/dev/null || [ ! -w "$out" ]; then
  echo "collector/build.sh: cannot write the binaries to $out (not a writable directory); set LORA_OTEL_BACKENDS_DIR to one" >&2
  exit 1
fi
# The binaries run here, on this machine: a GOOS/GOARCH/GOFLAGS of the user's shell never applies.
unset GOOS GOARCH GOARM GOAMD64 GO386 GOEXPERIMENT GOFLAGS
export CGO_ENABLED=0

build() {  # build NAME MODULE_DIR PACKAGE
  local name=$1 dir=$root/$2 pkg=$3 stamp
  # What the binary is built from and how: the Go toolchain and its target, this script's build
  # command, the module's files. The stamp also holds the binary's own checksum, so a binary
  # changed or cut short after its build is rebuilt, not reused.
  stamp=$( (go version; go env GOOS GOARCH CGO_ENABLED; sed -n '/go build -mod/p' "$0"; cd "$dir" && cat go.mod go.sum $(ls ./*.go 2>/dev/null)) | sha256sum | cut -c1-16)
  if [ -x "$out/$name" ] && [ -f "$out/$name.stamp" ] \
      && [ "$(cat "$out/$name.stamp")" = "$stamp $(sha256sum <"$out/$name" | cut -c1-16)" ]; then
    echo "$name=$out/$name"
    return
  fi
  echo "collector/build.sh: building $name from $2 (the first build on a machine takes minutes)" >&2
  local start=$SECONDS tmp
  # A private temporary name, renamed into place: two builds at once (two test sessions) never
  # write one file, and a binary is either the old one or the new one, never half of one.
  tmp=$(mktemp "$out/.$name.XXXXXX") || { echo "collector/build.sh: cannot create a file in $out" >&2; exit 1; }
  # -mod=readonly: go.mod and go.sum are the pinned versions; a build never changes them.
  if ! (cd "$dir" && go build -mod=readonly -trimpath -ldflags="-s -w" -o "$tmp" "$pkg"); then
    rm -f "$tmp"
    echo "collector/build.sh: building $name failed (above); a module the Go proxy does not serve shows as '403 Forbidden'" >&2
    exit 1
  fi
  chmod 755 "$tmp"
  mv -f "$tmp" "$out/$name"
  echo "$stamp $(sha256sum <"$out/$name" | cut -c1-16)" >"$out/$name.stamp.$$" && mv -f "$out/$name.stamp.$$" "$out/$name.stamp"
  echo "collector/build.sh: built $name in $((SECONDS - start)) s" >&2
  echo "$name=$out/$name"
}

build otelcol-lora collector/otelcol-lora .
build jaeger deploy/jaeger github.com/jaegertracing/jaeger/cmd/jaeger
