# The GPT part of scripts/convergence.sh, which sources it (its $run,
# $out, $NICE, variant_flags and probe_variants): a byte-level GPT on gcide
# (--dataset text: vocabulary 256, the held-out tail as validation set),
# trained through `axon-run train --emulate` in every variant of
# GPT_VARIANTS at every K of GPT_KS, learning rate of GPT_LRS (AdamW, no
# schedule) and seed of GPT_SEEDS. Every GPT_EVAL_EVERY steps (--eval-every) a run
# evaluates on GPT_EVAL windows of the validation set and prints its bits
# per byte, its training seconds so far (wall time of the train calls,
# evaluations excluded) and its modelled seconds (the timing model fed with
# the run's measured per-stage costs; the plots put step s at s times the
# run's final modelled seconds per step). Writes per K and learning rate the
# table gpt_table.md (final and best validation bits per byte, mean ± std
# over the seeds, and the mean wall and modelled seconds of the run) and
# the plots gpt_bpb_model_K*_lr*.png and gpt_bpb_wall_K*_lr*.png (each
# variant's mean over the seeds, error bars one std).
#
# Sequential is the same computation at every K (the modelled time of its
# one device is every stage's cost summed), so it runs at the first K only
# and its curves are repeated (CONV_SEQ_ONCE=0 runs every K). gpipe, 1f1b
# and 2bw split the mini-batch into max(4, K) micro-batches (GPT_BATCH must
# divide by it); pipemare is pipedream with --staleness pipemare.
#
# Budget (environment; with the defaults each learning rate takes about 22
# minutes on a shared 2-core machine): GPT_STEPS steps of batch GPT_BATCH
# of GPT_CONFIG (block 0 the embeddings, then one block per layer, then the
# head: K <= layers + 2), GPT_DATA for the text set, GPT_JOBS runs at a
# time of GPT_THREADS threads each.
if ! declare -F variant_flags >/dev/null; then
  echo "convergence_gpt.sh: run scripts/convergence.sh (it sources this part)" >&2
  return 2 2>/dev/null || exit 2
fi

GPT_VARIANTS=${GPT_VARIANTS:-"sequential gpipe 1f1b pipedream 2bw 2bw:predict pipedream:pipemare"}
GPT_KS=${GPT_KS:-"4 8"}
GPT_SEEDS=${GPT_SEEDS:-"1 2 3"}
GPT_STEPS=${GPT_STEPS:-300}
GPT_BATCH=${GPT_BATCH:-16}
GPT_LRS=${GPT_LRS:-"2e-3 5e-4"}
GPT_EVAL_EVERY=${GPT_EVAL_EVERY:-50}
GPT_EVAL=${GPT_EVAL:-512}
GPT_CONFIG=${GPT_CONFIG:-"layers=6,hidden=64,heads=4,ff=256,seq=64,dropout=0"}
GPT_DATA=${GPT_DATA:-"seq=64,max_bytes=4m"}
GPT_JOBS=${GPT_JOBS:-2}
GPT_THREADS=${GPT_THREADS:-1}
gdir="$out/gpt"
mkdir -p "$gdir"
probe_variants $GPT_VARIANTS
# The variant's name in files and in the table.
gpt_tag() { local v=${1/pipedream:pipemare/pipemare}; echo "${v/:/+}"; }

# One run: variant $1, K $2, learning rate $3, seed $4; its evaluations
# into RUN.evals, one line each: steps, validation bits per byte, wall
# seconds, modelled seconds.
gpt_run() {
  local v=$1 K=$2 lr=$3 seed=$4 m=$(($2 > 4 ? $2 : 4))
  local f="$gdir/$(gpt_tag "$v")_K${K}_lr${lr}_s${seed}"
  nice -n "$NICE" "$run" train --emulate --stages "$K" \
    $(variant_flags "$v" "$K" "$m") --model gpt --model-config "$GPT_CONFIG" \
    --dataset text --data-config "$GPT_DATA" --batch "$GPT_BATCH" \
    --steps "$GPT_STEPS" --eval-every "$GPT_EVAL_EVERY" \
    --eval-limit "$GPT_EVAL" --eval-batch 128 --threads "$GPT_THREADS" \
    --seed "$seed" --quiet --optim "opt=adamw,lr=$lr,wd=0,sched=const" \
    >"$f.log" 2>&1 || echo "convergence: gpt $v K=$K lr=$lr seed=$seed failed (see $f.log)" >&2
  sed -n 's/^epoch: .* steps=\([0-9]*\) .*train_seconds=\([-0-9.]*\) modelled_seconds=\([-0-9.]*\).*test_bits_per_byte=\([-0-9.a-z]*\).*/\1 \4 \2 \3/p' \
    "$f.log" >"$f.evals.tmp"
  mv "$f.evals.tmp" "$f.evals"
}

t_gpt=$(date +%s)
gpt_first_k=${GPT_KS%% *}
for lr in $GPT_LRS; do
  for seq_pass in 1 2; do # sequential's runs first, then the rest
    for K in $GPT_KS; do
      for v in $GPT_VARIANTS; do
        [ -n "${usable[$v]:-}" ] || continue
        { [ "$v" = sequential ] && [ $seq_pass = 1 ]; } ||
          { [ "$v" != sequential ] && [ $seq_pass = 2 ]; } || continue
        for seed in $GPT_SEEDS; do
          f="$gdir/$(gpt_tag "$v")_K${K}_lr${lr}_s${seed}.evals"
          [ -s "$f" ] && continue # resumable
          if [ "$v" = sequential ] && [ "$SEQ_ONCE" = 1 ] && [ "$K" != "$gpt_first_k" ]; then
            continue # copied below, once the first K's run is done
          fi
          while [ "$(jobs -rp | wc -l)" -ge "$GPT_JOBS" ]; do wait -n; done
          echo "convergence: gpt $v K=$K lr=$lr seed=$seed ($(( $(date +%s) - t_gpt )) s)" >&2
          gpt_run "$v" "$K" "$lr" "$seed" &
        done
      done
    done
  done
done
wait
if [ "$SEQ_ONCE" = 1 ]; then
  for lr in $GPT_LRS; do
    for K in $GPT_KS; do
      for seed in $GPT_SEEDS; do
        src="$gdir/sequential_K${gpt_first_k}_lr${lr}_s${seed}.evals"
        [ -s "$src" ] && [ "$K" != "$gpt_first_k" ] &&
          cp "$src" "$gdir/sequential_K${K}_lr${lr}_s${seed}.evals"
      done
    done
  done
fi
echo "convergence: gpt done in $(( $(date +%s) - t_gpt )) s" >&2

# Per (variant $1, K $2, learning rate $3): the mean curve over the seeds
# (steps, mean bpb, std, mean wall s, mean modelled s, seeds) into .mean,
# and the table's row.
gpt_mean() {
  local files=()
  for seed in $GPT_SEEDS; do
    local f="$gdir/$(gpt_tag "$1")_K$2_lr$3_s${seed}.evals"
    [ -s "$f" ] && files+=("$f")
  done
  [ ${#files[@]} -gt 0 ] || return 1
  # The modelled time of step s: s times the run's last modelled seconds
  # per step (the model's steady state with all the run's measured costs;
  # an early evaluation's figure comes from the few actions seen by then).
  for f in "${files[@]}"; do
    awk '{ l[NR] = $0; s = $1; m = $4 }
         END { for (i = 1; i <= NR; i++) { split(l[i], x, " ");
               print x[1], x[2], x[3], x[1] * m / s } }' "$f"
  done |
    awk '{ n[$1]++; s[$1] += $2; q[$1] += $2 * $2; w[$1] += $3; m[$1] += $4 }
         END { for (k in n) { a = s[k] / n[k]; v = q[k] / n[k] - a * a;
               printf "%d %.4f %.4f %.2f %.3f %d\n", k, a, sqrt(v > 0 ? v : 0),
                      w[k] / n[k], m[k] / n[k], n[k] } }' |
    sort -n >"$gdir/$(gpt_tag "$1")_K$2_lr$3.mean"
  # final and best bpb per seed -> mean and std of each
  for f in "${files[@]}"; do
    awk 'BEGIN { b = 1e9 } { if ($2 + 0 < b) b = $2 + 0; last = $0 }
         END { split(last, x, " "); print x[2], b, x[3], x[4] }' "$f"
  done | awk '{ n++; a += $1; aa += $1 * $1; b += $2; bb += $2 * $2; w += $3; m += $4 }
              END { va = aa / n - (a / n) ^ 2; vb = bb / n - (b / n) ^ 2;
                    printf "%.3f ± %.3f | %.3f ± %.3f | %.0f | %.2f | %d\n",
                      a / n, sqrt(va > 0 ? va : 0), b / n, sqrt(vb > 0 ? vb : 0),
                      w / n, m / n, n }'
}
{
  for lr in $GPT_LRS; do
    for K in $GPT_KS; do
      echo
      echo "K = $K, lr $lr ($GPT_STEPS steps of batch $GPT_BATCH; mean ± std over seeds $GPT_SEEDS)"
      echo
      echo "| variant | final val bits/byte | best val bits/byte | wall s | modelled s | seeds |"
      echo "|---|---|---|---|---|---|"
      for v in $GPT_VARIANTS; do
        if [ -z "${usable[$v]:-}" ]; then echo "| $(gpt_tag "$v") | skipped | | | | |"; continue; fi
        row=$(gpt_mean "$v" "$K" "$lr") || row="n/a | | | | "
        echo "| $(gpt_tag "$v") | $row |"
      done
    done
  done
} >"$out/gpt_table.md"
cat "$out/gpt_table.md"

if command -v gnuplot >/dev/null; then
  for lr in $GPT_LRS; do for K in $GPT_KS; do
    pm="" pw=""
    for v in $GPT_VARIANTS; do
      f="$gdir/$(gpt_tag "$v")_K${K}_lr$lr.mean"
      [ -s "$f" ] || continue
      pm="$pm${pm:+, }'$f' using 5:2:3 with yerrorlines title '$(gpt_tag "$v")'"
      pw="$pw${pw:+, }'$f' using 4:2:3 with yerrorlines title '$(gpt_tag "$v")'"
    done
    [ -n "$pm" ] || continue
    gnuplot <<EOF
set terminal png size 800,500
set key top right
set grid
set ylabel 'validation bits per byte'
set title 'byte-level GPT on gcide, K = $K, lr $lr (emulated; mean of seeds $GPT_SEEDS)'
set output '$out/gpt_bpb_model_K${K}_lr$lr.png'
set xlabel 'modelled time (s)'
plot $pm
set output '$out/gpt_bpb_wall_K${K}_lr$lr.png'
set xlabel 'wall time of the training calls (s)'
plot $pw
EOF
  done; done
else
  echo "convergence: no gnuplot (scripts/deps.sh installs gnuplot-nox): no plots" >&2
fi
