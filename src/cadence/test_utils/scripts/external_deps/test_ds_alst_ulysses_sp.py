"""DeepSpeed ALST / Ulysses sequence parallelism needs DeepSpeed: the script checks that asking for it
without a DeepSpeed plugin fails with a clear error before any training (the training itself is
checked by tests/test_sequence_parallel.py)."""

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
    check(False, "sequence parallelism without DeepSpeed was accepted")


if __name__ == "__main__":
    main()
