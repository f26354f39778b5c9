"""`python -m nanovllm`: the `nanovllm` command, for an environment whose scripts folder is not on PATH."""

from nanovllm.cli import main

if __name__ == "__main__":
    main()
