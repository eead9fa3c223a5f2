#!/usr/bin/env bash
# The measured run of docs/client-server.md: `luasnap serve` and 16 `luasnap client` processes
# on 127.0.0.1, latency 30..150 ms one way (8 ms apart), jitter a quarter of it, 5% loss each
# way, 600 frames at 30 frames a second; the 16th client joins after 7 s from a save-game.
# Usage: benches/serve_16_clients.sh [GAME] [OUT_DIR]   (build first: cargo build --release)
set -euo pipefail
GAME=${1:-tests/lua/tiny_game.lua}
OUT=${2:-target/serve16}
BIN=${LUASNAP:-target/release/luasnap}
PORT=${PORT:-7716}
mkdir -p "$OUT"
"$BIN" serve "$GAME" --port "$PORT" --bind 127.0.0.1 --players 16 --frames 600 --start-with 15 \
  --json > "$OUT/server.json" 2> "$OUT/server.err" &
server=$!
sleep 1
pids=()
for i in $(seq 0 14); do
  lat=$((30 + 8 * i))
  "$BIN" client "$GAME" --connect "127.0.0.1:$PORT" --latency $lat --jitter $((lat / 4)) --loss 5 \
    --json > "$OUT/client$i.json" 2> "$OUT/client$i.err" &
  pids+=($!)
done
sleep 7
"$BIN" client "$GAME" --connect "127.0.0.1:$PORT" --latency 150 --jitter 37 --loss 5 \
  --json > "$OUT/client15.json" 2> "$OUT/client15.err" &
pids+=($!)
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
wait "$server" || status=1
python3 - "$OUT" <<'PY'
import json, sys, glob, os
out = sys.argv[1]
s = json.load(open(os.path.join(out, "server.json")))
print(f"server: {s['frames']} frames, value digest {s['value_digest']}, {s['seconds']:.1f} s, "
      f"CPU {s['cpu_us_per_frame']:.0f} µs/frame (busy {s['busy_us_per_frame']:.0f}, G.step {s['step_us']:.0f}, "
      f"digest {s['digest_us']:.0f}), {s['saves']} save-games, resyncs {s['resyncs']}")
print("| client | latency ms | joined | rollbacks | re-simulated | overhead µs median / p99 | overhead s total | sent KiB/s | received KiB/s | delay | desyncs | resyncs | digest |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for i in range(16):
    c = json.load(open(os.path.join(out, f"client{i}.json")))
    lat = 150 if i == 15 else 30 + 8 * i
    secs = c["seconds"]
    print(f"| {i+1} | {lat} | {c['joined_at'] if c['joined_at'] is not None else 'init'} | {c['rollbacks']} | {c['resimulated_frames']} | "
          f"{c['rollback_overhead_us_median']:.0f} / {c['rollback_overhead_us_p99']:.0f} | {c['rollback_overhead_seconds_total']:.2f} | "
          f"{c['bytes_sent']/1024/secs:.1f} | {c['bytes_received']/1024/secs:.1f} | {c['delay_frames']} | {c['desyncs']} | {c['resyncs']} | "
          f"{'equal' if c['matches_server'] else 'DIFFERS'} |")
PY
exit $status
