"""Big-model inference: empty init, sizes and device maps, loading, CPU/disk offload, dispatch hooks.

The public paths of Accelerate (`cadence.big_modeling`, `cadence.hooks`, `cadence.utils.modeling`,
`cadence.utils.offload`, `cadence.inference`) re-export the names defined in these modules:

- `sizes`: byte sizes of dtypes, tensors and modules (`compute_module_sizes`, `dtype_byte_size`...).
- `tensors`: moving one parameter or buffer (`set_module_tensor_to_device`) and tied weights.
- `device_map`: available memory and device maps (`get_max_memory`, `infer_auto_device_map`...).
- `offload`: weights written to disk as raw `.dat` files plus `index.json`, read back lazily.
- `loading`: reading (sharded) checkpoints into a model, following a device map.
- `hooks`: forward hooks that move weights and activations (`AlignDevicesHook`...).
- `empty_init`: `init_empty_weights` / `init_on_device`.
- `dispatch`: `dispatch_model`, `cpu_offload`, `disk_offload`, `load_checkpoint_and_dispatch`.
- `training_checks`: what `Accelerator.prepare` / `save_model` do with a dispatched model.
- `pipeline`: `prepare_pippy` on `torch.distributed.pipelining`.
"""
