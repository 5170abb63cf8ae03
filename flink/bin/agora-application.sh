#!/usr/bin/env bash
# A Flink application cluster on Agora, its JobManager in the foreground:
# runs JOB.jar's main method, gets TaskManagers from Agora, and when the
# application ends releases everything and exits.
#   FLINK_HOME=... flink/bin/agora-application.sh --jar JOB.jar [--class MAIN] \
#     -Dagora.master=HOST:PORT [-Dkey=value ...] [-- PROGRAM ARGS ...]
exec "$(dirname "$0")/agora-jobmanager.sh" agora.flink.AgoraApplicationClusterEntrypoint "$@"
