#!/usr/bin/env bash
# env_on_rank.sh RANK VAR=VALUE CMD...: runs CMD with VAR=VALUE set on MPI rank RANK only (the
# other ranks run it unchanged), for tests of an error that one rank alone meets.
set -eu
rank="$1" assignment="$2"
shift 2
if [ "${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}" = "$rank" ]; then export "${assignment?}"; fi
exec "$@"
