#!/usr/bin/env bash
# A Flink session cluster on Agora, its JobManager in the foreground: jobs
# are submitted with Flink's `bin/flink run -m HOST:REST_PORT`, and
# TaskManagers are started as Agora tasks when jobs need slots.
#   FLINK_HOME=... flink/bin/agora-session.sh -Dagora.master=HOST:PORT [-Dkey=value ...]
# See docs/flink.md for the agora.* keys.
exec "$(dirname "$0")/agora-jobmanager.sh" agora.flink.AgoraSessionClusterEntrypoint "$@"
