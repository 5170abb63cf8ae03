#!/usr/bin/env bash
# Runs a Flink-on-Agora JobManager in the foreground; used by
# agora-session.sh and agora-application.sh, not called directly.
# Usage: agora-jobmanager.sh CLASS ARGS...
# Environment: FLINK_HOME (required), FLINK_CONF_DIR (default
# $FLINK_HOME/conf), FLINK_LOG_DIR, AGORA_FLINK_JAR (default
# flink/target/agora-flink.jar), AGORA_FLINK_BRIDGE (default: the
# workspace's target/{release,debug}/agora-flink-bridge, else the PATH).
set -eo pipefail
class=$1
shift
agora_flink=$(cd "$(dirname "$0")/.." && pwd)
if [ -z "${FLINK_HOME:-}" ]; then
  echo "$(basename "$0"): set FLINK_HOME to a Flink 2.3.0 distribution" >&2
  exit 1
fi
export FLINK_HOME
jar=${AGORA_FLINK_JAR:-$agora_flink/target/agora-flink.jar}
if [ ! -f "$jar" ]; then
  echo "$(basename "$0"): $jar is missing: run FLINK_HOME=$FLINK_HOME flink/build.sh" >&2
  exit 1
fi
if [ -z "${AGORA_FLINK_BRIDGE:-}" ]; then
  for candidate in "$agora_flink/../target/release/agora-flink-bridge" "$agora_flink/../target/debug/agora-flink-bridge"; do
    if [ -x "$candidate" ]; then
      AGORA_FLINK_BRIDGE=$(cd "$(dirname "$candidate")" && pwd)/agora-flink-bridge
      export AGORA_FLINK_BRIDGE
      break
    fi
  done
fi

# Flink's own scripts compute the JobManager's JVM memory flags and class path.
# (config.sh is not written for `set -e`.)
set +e
_FLINK_HOME_DETERMINED=1
. "$FLINK_HOME/bin/config.sh"

# Only the -D settings go to Flink's memory calculation.
dynamic=()
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    --) break ;;
    -D) dynamic+=("-D" "${args[$((i + 1))]}"); i=$((i + 1)) ;;
    -D*) dynamic+=("${args[$i]}") ;;
  esac
done
export FLINK_ENV_JAVA_OPTS="${FLINK_ENV_JAVA_OPTS} ${FLINK_ENV_JAVA_OPTS_JM}"
parseJmArgsAndExportLogs "${dynamic[@]}"

mkdir -p "$FLINK_LOG_DIR"
log="$FLINK_LOG_DIR/flink-agora-jobmanager-$(hostname).log"
log_setting=("-Dlog.file=$log" "-Dlog4j.configurationFile=file:$FLINK_CONF_DIR/log4j-console.properties" "-Dlogback.configurationFile=file:$FLINK_CONF_DIR/logback-console.xml")
FLINK_ENV_JAVA_OPTS=$(eval echo ${FLINK_ENV_JAVA_OPTS})
classpath="$(constructFlinkClassPath):$jar"
# shellcheck disable=SC2086
exec "$JAVA_RUN" $JVM_ARGS ${FLINK_ENV_JAVA_OPTS} "${log_setting[@]}" -classpath "$(manglePathList "$classpath")" \
  "$class" --configDir "$FLINK_CONF_DIR" "$@"
