#!/bin/sh
# deps.sh GROUP - make sure the Debian packages a make target needs are
# installed: installs them as root (saying so), otherwise stops with the
# exact apt-get line to run.
set -e
case "$1" in
    build) pkgs="gcc make libc6-dev zlib1g-dev libjansson-dev" ;;
    test) pkgs="gcc make libc6-dev zlib1g-dev libjansson-dev libcmocka-dev python3-numpy" ;;
    fuzz) pkgs="clang libclang-rt-dev libomp-dev zlib1g-dev libjansson-dev" ;;
    bench) pkgs="gcc make libc6-dev libopenblas-dev libdnnl-dev python3-torch python3-venv" ;;
    data) pkgs="dataset-fashion-mnist" ;;
    text) pkgs="fortunes" ;;
    pkgconfig) pkgs="pkg-config" ;;
    mpi) pkgs="gcc make libc6-dev libopenmpi-dev openmpi-bin" ;;
    browser) pkgs="chromium" ;;
    *) echo "deps.sh: unknown group '$1'" >&2; exit 2 ;;
esac
missing=""
for p in $pkgs; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "mixprec: missing Debian packages:$missing" >&2
    echo "mixprec: run as root:  apt-get install -y$missing" >&2
    exit 1
fi
echo "mixprec: installing Debian packages:$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends $missing
