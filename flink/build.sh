#!/usr/bin/env bash
# Builds Flink on Agora's Java side with javac and jar against exactly the
# Flink whose FLINK_HOME is given (2.3.0: the driver uses Flink's
# @Internal resource-manager interfaces, which change between versions):
#   flink/target/agora-flink.jar       the driver, its factory, the entrypoints
#   flink/target/agora-flink-jobs.jar  the test jobs (WordCount, Forever)
# Usage: FLINK_HOME=/path/to/flink flink/build.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: "${FLINK_HOME:?set FLINK_HOME to a Flink 2.3.0 distribution (e.g. site-packages/pyflink of apache-flink==2.3.0)}"
want=2.3.0
if [ ! -f "$FLINK_HOME/lib/flink-dist-$want.jar" ]; then
  echo "build.sh: $FLINK_HOME/lib/flink-dist-$want.jar not found: Flink on Agora is built for Flink $want" >&2
  exit 1
fi
out="$here/target"
rm -rf "$out/classes" "$out/jobs-classes"
mkdir -p "$out/classes" "$out/jobs-classes"
cp="$FLINK_HOME/lib/*"
javac -nowarn -encoding UTF-8 --release 11 -cp "$cp" -d "$out/classes" \
  $(find "$here/src" -name '*.java')
jar --create --file "$out/agora-flink.jar" -C "$out/classes" .
javac -nowarn -encoding UTF-8 --release 11 -cp "$cp" -d "$out/jobs-classes" \
  $(find "$here/jobs" -name '*.java')
jar --create --file "$out/agora-flink-jobs.jar" --main-class agora.flink.jobs.WordCount \
  -C "$out/jobs-classes" .
echo "built $out/agora-flink.jar and $out/agora-flink-jobs.jar against Flink $want"
