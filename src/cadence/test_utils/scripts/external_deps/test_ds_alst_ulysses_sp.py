"""DeepSpeed ALST / Ulysses sequence parallelism. Cadence does not drive DeepSpeed's sequence
parallelism: the script checks that asking for it fails with a clear error before any training."""

from __future__ import annotations

from cadence.test_utils.scripts._checks import check


def main() -> None:
    """Run every check of this script on this process; the first failure raises."""
    from cadence.utils import DeepSpeedSequenceParallelConfig

    try:
        from cadence import Accelerator, ParallelismConfig

        config = ParallelismConfig(
            sp_backend="deepspeed", sp_size=2, sp_handler=DeepSpeedSequenceParallelConfig()
        )
        Accelerator(parallelism_config=config)
    except (NotImplementedError, ValueError, TypeError, ImportError) as error:
        print(f"Sequence parallelism is refused with a clear error: {error}")
        return
    check(False, "DeepSpeed sequence parallelism was accepted, but Cadence does not implement it")


if __name__ == "__main__":
    main()
