"""Generated from proto/slotshift/v1 by scripts/gen_protos.py; do not edit."""
