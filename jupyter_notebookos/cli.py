"""The `notebookos` console script."""


def main() -> None:
    raise SystemExit("notebookos: not implemented yet")
