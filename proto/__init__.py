"""kvgate's own wire formats (``*.proto``) and their generated Python modules (scripts/gen_proto.sh)."""
