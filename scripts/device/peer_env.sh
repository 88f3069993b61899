# Sourced by the device scripts: cuVS staged in /tmp/peer-site (../shared/tools/stage-cuvs) on the
# import path with its libraries, when the lease has it; nothing otherwise.
peers=${KNNKIT_PEER_SITE:-/tmp/peer-site}
if [ -d "$peers" ]; then
  export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$peers
  export LD_LIBRARY_PATH=$(ls -d "$peers"/lib*/lib64 "$peers"/lib*/lib "$peers"/nvidia/*/lib 2>/dev/null | tr '\n' ':')${LD_LIBRARY_PATH:-}
  export LD_PRELOAD=$(ls "$peers"/nvidia/*/lib/libnvJitLink.so.13 2>/dev/null | head -1)
fi
