"""A diffusers training loop shaped like its examples/unconditional_image_generation script: a tiny
UNet2DModel, DDPM noise, an EMA copy, save/load-state pre-hooks writing `from_pretrained` folders, a
mid-run `save_state` and a resumed run, and `from_pretrained(low_cpu_mem_usage=True)` of the result.

python diffusers_cases.py OUTPUT_DIR  ->  prints `RESULT {...}`
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import digest, ensure_alias, quiet, report  # noqa: E402

ensure_alias()
quiet()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from accelerate.utils import ProjectConfiguration, set_seed  # noqa: E402
from diffusers import DDPMScheduler, UNet2DModel  # noqa: E402
from diffusers.training_utils import EMAModel  # noqa: E402

OUT = sys.argv[1]
STEPS, SAVE_AT = 6, 3


def unet() -> UNet2DModel:
    return UNet2DModel(
        sample_size=8, in_channels=3, out_channels=3, layers_per_block=1,
        block_out_channels=(8, 16), down_block_types=("DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D"), norm_num_groups=4,
    )  # fmt: skip


def images(step: int) -> torch.Tensor:
    return torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(step))


def run(name: str, resume: str | None = None):
    set_seed(0)
    accelerator = Accelerator(
        cpu=True,
        project_config=ProjectConfiguration(project_dir=os.path.join(OUT, name)),
    )
    model = unet()
    ema = EMAModel(model.parameters(), decay=0.9, model_cls=UNet2DModel, model_config=model.config)
    noise_scheduler = DDPMScheduler(num_train_timesteps=50)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def save_hook(models, weights, output_dir):
        if accelerator.is_main_process:
            ema.save_pretrained(os.path.join(output_dir, "unet_ema"))
            for saved in models:
                saved.save_pretrained(os.path.join(output_dir, "unet"))
                weights.pop()

    def load_hook(models, input_dir):
        loaded = EMAModel.from_pretrained(os.path.join(input_dir, "unet_ema"), UNet2DModel)
        ema.load_state_dict(loaded.state_dict())
        del loaded
        for _ in range(len(models)):
            target = models.pop()
            loaded = UNet2DModel.from_pretrained(input_dir, subfolder="unet")
            target.register_to_config(**loaded.config)
            target.load_state_dict(loaded.state_dict())
            del loaded

    accelerator.register_save_state_pre_hook(save_hook)
    accelerator.register_load_state_pre_hook(load_hook)
    model, optimizer = accelerator.prepare(model, optimizer)
    start = 0
    if resume is not None:
        accelerator.load_state(resume)
        start = SAVE_AT
    for step in range(start, STEPS):
        clean = images(step)
        generator = torch.Generator().manual_seed(1000 + step)
        noise = torch.randn(clean.shape, generator=generator)
        timesteps = torch.randint(0, 50, (clean.shape[0],), generator=generator)
        noisy = noise_scheduler.add_noise(clean, noise, timesteps)
        with accelerator.accumulate(model):
            loss = F.mse_loss(model(noisy, timesteps).sample, noise)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            ema.step(model.parameters())
        if step + 1 == SAVE_AT and resume is None:
            accelerator.save_state(os.path.join(OUT, name, "checkpoint"))
    final = accelerator.unwrap_model(model)
    shadow = unet()
    ema.copy_to(shadow.parameters())
    final.save_pretrained(os.path.join(OUT, name, "final"))
    return digest(final.state_dict()), digest(shadow.state_dict())


unet_full, ema_full = run("full")
unet_resumed, ema_resumed = run("resumed", resume=os.path.join(OUT, "full", "checkpoint"))
reloaded = UNet2DModel.from_pretrained(os.path.join(OUT, "full", "final"), low_cpu_mem_usage=True)
report(
    {
        "unet": unet_full,
        "ema": ema_full,
        "unet_resumed": unet_resumed,
        "ema_resumed": ema_resumed,
        "reloaded": digest(reloaded.state_dict()),
    }
)
