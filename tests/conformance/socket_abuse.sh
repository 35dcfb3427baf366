#!/usr/bin/env bash
# Raw-socket abuse of pdserve-decode (socket_abuse.py): slowloris, half-closed connections,
# garbage bytes, pipelining, and twenty streams cut off by their clients, after which no KV
# block may be in use. Eight running sequences at most, so that some of the cut-off streams
# are still waiting when their clients leave.
# shellcheck source=server.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/server.sh"
set_deadline 100

make_model
start_server URL --max-num-seqs 8
check "raw-socket checks" interruptible "$PYTHON" "$(dirname "${BASH_SOURCE[0]}")/socket_abuse.py" "$URL"
check "SIGTERM: the server exits 0" stop_servers
finish
