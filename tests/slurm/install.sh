#!/usr/bin/env bash
# Installs the Debian packages of the test Slurm cluster (tests/slurm/cluster.py) when missing:
# Slurm's daemons and clients, munge, slurmdbd and MariaDB (for sacct). Needs root and apt-get;
# without them it says so and exits 0 (the Slurm tests then skip with the reason).
# The packages' services are not started: the tests run their own daemons from a temp folder.
set -euo pipefail
packages=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "tests/slurm/install.sh: missing ${missing[*]}, and no root/apt-get to install them:" \
    "the Slurm tests will skip" >&2
  exit 0
fi
# A policy-rc.d that refuses every service start keeps the install from starting munge,
# slurmctld, slurmd, slurmdbd and mariadb; removed again afterwards (unless one was there).
policy=/usr/sbin/policy-rc.d
own_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy"
  chmod 755 "$policy"
  own_policy=1
fi
cleanup() { if [ "$own_policy" = 1 ]; then rm -f "$policy"; fi; }
trap cleanup EXIT
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
