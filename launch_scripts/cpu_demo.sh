#!/bin/bash
# A short Cooper training on a CPU-only machine (minutes): SmolLM2-135M-Instruct policy, synthetic arithmetic
# prompts, and a reward model (default: the tiny Qwen2 RM; pass a VerifyRM export, e.g. one trained from
# MiniLM with `python -m cooper_openrlhf.cli.verifyrm train`, as the first argument).
#   bash launch_scripts/cpu_demo.sh [RM_PATH] [OUT_DIR] [extra train_cooper flags]
set -euo pipefail
MODELS=$(python -c "from cooper_openrlhf.models.paths import models_dir; print(models_dir())")
RM=${1:-$MODELS/tiny-qwen2-rm}
OUT=${2:-$PWD/runs/cpu_demo}
shift $(( $# < 2 ? $# : 2 ))
mkdir -p "$OUT"
python -c "
import json
from cooper_openrlhf.data.synthetic import make_arithmetic_problems
with open('$OUT/prompts.jsonl', 'w') as f:
    for p in make_arithmetic_problems(32, seed=0, max_operand=30):
        f.write(json.dumps({'question': p.question, 'answer': p.reference}) + '\n')
"
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 VLLM_CPU_KVCACHE_SPACE=1 TOKENIZERS_PARALLELISM=false
python -m cooper_openrlhf.cli.train_cooper --remote_rm_trainable \
  --actor.model_name_or_path "$MODELS/smollm2-135m-instruct" --reward.model_name_or_path "$RM" \
  --data.prompt_dataset "$OUT/prompts.jsonl" --data.input_key question --data.label_key answer \
  --data.apply_chat_template --data.max_len 1024 --rollout.max_new_tokens 96 \
  --algo.advantage.estimator group_norm --rollout.n_samples_per_prompt 4 --rollout.batch_size 8 \
  --rollout.micro_batch_size 8 --train.batch_size 32 --train.micro_batch_size 8 \
  --algo.kl.use_loss --algo.kl.estimator k3 --algo.kl.init_coef 0.001 --actor.adam.lr 1e-6 \
  --actor.num_gpus_per_node 1 --ref.num_gpus_per_node 1 --reward.num_gpus_per_node 1 \
  --vllm.num_engines 1 --vllm.sync_backend gloo --vllm.enforce_eager \
  --ds.zero_stage 2 --ds.param_dtype bf16 --ds.attn_implementation eager \
  --cooper.rm_lr 1e-5 --cooper.rm_max_length 512 --cooper.negative_max_new_tokens 96 \
  --ckpt.save_steps 2 --ckpt.path "$OUT/ckpt" --ckpt.output_dir "$OUT/final" \
  --logger.tensorboard_dir "$OUT/tensorboard" --cooper.sample_log_dir "$OUT/samples" "$@"
