"""Plain softmax attention: the smallest spec there is."""
import attncompiler as ac
from attncompiler.testing import run_example


def make_spec(head_dim: int = 128) -> ac.AttentionSpec:
    return ac.AttentionSpec(head_dim=head_dim, dtype="bf16", name="plain")


def main() -> int:
    return run_example(make_spec())


if __name__ == "__main__":
    raise SystemExit(main())
