"""One process: transformers' Trainer with gradient accumulation, resume from a mid-run checkpoint,
evaluate + predict, gradient checkpointing, a peft LoRA, and `from_pretrained` with device maps.

python trainer_cases.py OUTPUT_DIR  ->  prints `RESULT {...}` (digests, checks, steps/s)
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import TokenDataset, digest, ensure_alias, quiet, report, tiny_gpt2_config  # noqa: E402

ensure_alias()
quiet()

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

OUT = sys.argv[1]


def arguments(name: str, **overrides) -> TrainingArguments:
    settings = dict(
        output_dir=os.path.join(OUT, name), per_device_train_batch_size=4,
        per_device_eval_batch_size=4, gradient_accumulation_steps=2, max_steps=6,
        learning_rate=1e-3, logging_steps=100, save_strategy="no", report_to="none", use_cpu=True,
        seed=0, disable_tqdm=True, dataloader_num_workers=0,
    )  # fmt: skip
    settings.update(overrides)
    return TrainingArguments(**settings)


def fresh_model() -> GPT2LMHeadModel:
    transformers.set_seed(0)
    return GPT2LMHeadModel(tiny_gpt2_config())


def train(name: str, model=None, resume=None, **overrides):
    model = model if model is not None else fresh_model()
    trainer = Trainer(model=model, args=arguments(name, **overrides), train_dataset=TokenDataset())
    output = trainer.train(resume_from_checkpoint=resume)
    return trainer, output


result: dict = {}
import accelerate  # noqa: E402

result["accelerate_version"] = accelerate.__version__
result["accelerate_available"] = transformers.utils.is_accelerate_available()

# gradient accumulation (2 micro-batches of 4), checkpoints every 3 optimizer steps
trainer, output = train("full", save_strategy="steps", save_steps=3)
result["accumulation"] = digest(trainer.model.state_dict())
result["global_step"] = trainer.state.global_step
result["train_loss_finite"] = bool(torch.isfinite(torch.tensor(output.training_loss)))
result["steps_per_second"] = output.metrics["train_steps_per_second"]

# resume from the mid-run checkpoint in a new Trainer with a new model
checkpoint = os.path.join(OUT, "full", "checkpoint-3")
resumed, _ = train("resumed", resume=checkpoint, save_strategy="steps", save_steps=3)
result["resumed"] = digest(resumed.model.state_dict())

# evaluate + predict, against the model run by hand
eval_data = TokenDataset(count=8, seed=1)
metrics = trainer.evaluate(eval_data)
prediction = trainer.predict(eval_data)
model = trainer.model.eval()
with torch.no_grad():
    batch = eval_data.ids
    logits = model(input_ids=batch).logits
    # transformers divides each batch's summed token losses by its number of label tokens
    # (num_items_in_batch: every label, the first one that has no prediction included)
    losses = [
        model(input_ids=b, labels=b).loss * (b.shape[1] - 1) / b.shape[1] for b in batch.split(4)
    ]
result["eval_loss"] = round(metrics["eval_loss"], 6)
result["eval_loss_matches"] = abs(metrics["eval_loss"] - float(torch.stack(losses).mean())) < 1e-4
result["predict_matches"] = bool(
    torch.allclose(torch.as_tensor(prediction.predictions), logits, atol=1e-5)
)

# gradient checkpointing: the same run with activations recomputed
checkpointed, _ = train("checkpointing", gradient_checkpointing=True)
result["gradient_checkpointing"] = digest(checkpointed.model.state_dict())

# peft LoRA on the attention projections
import peft  # noqa: E402

base = fresh_model()
before = {k: v.clone() for k, v in base.state_dict().items()}
lora = peft.get_peft_model(
    base,
    peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], fan_in_fan_out=True),
)
lora_trainer, _ = train("lora", model=lora, learning_rate=1e-2)
trained = {k: v for k, v in lora_trainer.model.state_dict().items() if "lora_" in k}
result["lora"] = digest(trained)
result["lora_b_trained"] = all(bool(v.abs().sum() > 0) for k, v in trained.items() if "lora_B" in k)
merged = lora_trainer.model.get_base_model().state_dict()
result["lora_base_frozen"] = all(
    torch.equal(merged[k.replace(".weight", ".base_layer.weight")], before[k])
    if k.replace(".weight", ".base_layer.weight") in merged
    else torch.equal(merged[k], before[k])
    for k in before
    if k in merged or k.replace(".weight", ".base_layer.weight") in merged
)

# from_pretrained with device maps, offload to cpu and disk: logits equal to the plain load
saved = os.path.join(OUT, "saved")
trainer.model.save_pretrained(saved)
ids = torch.tensor([[5, 17, 3, 42, 8, 9]])
with torch.no_grad():
    plain = GPT2LMHeadModel.from_pretrained(saved).eval()(ids).logits
    loads = {
        "auto": dict(device_map="auto"),
        "sequential": dict(device_map="sequential"),
        # a size string the caller's dict holds: transformers needs it converted in place
        "cpu_disk_offload": dict(
            device_map="auto", max_memory={"cpu": "80KB"}, offload_folder=os.path.join(OUT, "off")
        ),
        "sequential_offload": dict(
            device_map="sequential",
            max_memory={"cpu": "80KB"},
            offload_folder=os.path.join(OUT, "off_seq"),
        ),
        "low_cpu_mem_usage": dict(low_cpu_mem_usage=True),
        "cpu_map": dict(device_map={"": "cpu"}),
    }
    for name, kwargs in loads.items():
        loaded = GPT2LMHeadModel.from_pretrained(saved, **kwargs).eval()
        devices = sorted({str(d) for d in getattr(loaded, "hf_device_map", {}).values()})
        result[f"load_{name}"] = {
            "equal": bool(torch.equal(loaded(ids).logits, plain)),
            "devices": devices,
        }

report(result)
