#!/usr/bin/env bash
# The Debian packages the embedded default needs: trans-de-en (its English–German pairs) and wordnet-base (ConIsI's
# antonyms). Installs those that are missing; when they cannot be installed, exits 1 with one line naming them and
# the command that installs them. TRANS_DE_EN and WORDNET_ADJ: where the files are looked for.
set -uo pipefail
TRANS_DE_EN=${TRANS_DE_EN:-/usr/share/trans/de-en}
WORDNET_ADJ=${WORDNET_ADJ:-/usr/share/wordnet/data.adj}

missing() {
  local packages=""
  [ -f "$TRANS_DE_EN" ] || packages="$packages trans-de-en"
  [ -f "$WORDNET_ADJ" ] || packages="$packages wordnet-base"
  echo "$packages"
}

packages=$(missing)
[ -z "$packages" ] && exit 0
sudo_cmd=""
if [ "$(id -u)" != "0" ]; then sudo_cmd="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
# shellcheck disable=SC2086 # the package names are words
{ $sudo_cmd apt-get install -y -qq $packages || { $sudo_cmd apt-get update -qq && $sudo_cmd apt-get install -y -qq $packages; }; } >"$log" 2>&1
said=$(grep -v '^\s*$' "$log" | tail -n 1)
rm -f "$log"
packages=$(missing)
if [ -n "$packages" ]; then
  echo "scripts/setup.sh: Debian's${packages} could not be installed (apt-get: ${said:-no output}); install with:" \
    "sudo apt-get update && sudo apt-get install -y${packages}" >&2
  exit 1
fi
