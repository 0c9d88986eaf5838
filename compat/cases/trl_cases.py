"""TRL's SFTTrainer on a tiny GPT-2 with a word-level tokenizer built in place, and its resume from a
mid-run checkpoint.

python trl_cases.py OUTPUT_DIR  ->  prints `RESULT {...}`
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import digest, ensure_alias, quiet, report, tiny_gpt2_config  # noqa: E402

ensure_alias()
quiet()

import datasets  # noqa: E402
import tokenizers  # noqa: E402
import transformers  # noqa: E402
from transformers import GPT2LMHeadModel  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

OUT = sys.argv[1]
WORDS = [f"w{i}" for i in range(60)]


def tokenizer() -> transformers.PreTrainedTokenizerFast:
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    model = tokenizers.models.WordLevel(vocab=vocab, unk_token="<unk>")
    raw = tokenizers.Tokenizer(model)
    raw.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=raw, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def texts() -> datasets.Dataset:
    lines = [" ".join(WORDS[(i * 7 + j * 3) % 60] for j in range(10)) for i in range(32)]
    return datasets.Dataset.from_dict({"text": lines})


def train(name: str, resume=None):
    transformers.set_seed(0)
    model = GPT2LMHeadModel(tiny_gpt2_config(pad_token_id=0, eos_token_id=1, bos_token_id=1))
    config = SFTConfig(
        output_dir=os.path.join(OUT, name), per_device_train_batch_size=4, max_steps=4,
        learning_rate=1e-3, logging_steps=100, save_strategy="steps", save_steps=2, report_to="none",
        use_cpu=True, seed=0, disable_tqdm=True, max_length=16, packing=False, bf16=False,
        dataloader_num_workers=0,
    )  # fmt: skip
    trainer = SFTTrainer(
        model=model, args=config, train_dataset=texts(), processing_class=tokenizer()
    )
    output = trainer.train(resume_from_checkpoint=resume)
    return trainer, output


full, output = train("sft")
resumed, _ = train("sft_resumed", resume=os.path.join(OUT, "sft", "checkpoint-2"))
report(
    {
        "sft": digest(full.model.state_dict()),
        "sft_resumed": digest(resumed.model.state_dict()),
        "global_step": full.state.global_step,
        "steps_per_second": output.metrics["train_steps_per_second"],
    }
)
