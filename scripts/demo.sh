#!/usr/bin/env bash
# Quick start, step one: the local stack on the emulator with a short demo load.
# Extra arguments go to `slotshift up` (for example --demo-duration-s 30).
source "$(dirname "$0")/bootstrap.sh"
exec slotshift up --config deploy/local/slotshift.yaml --demo "$@"
