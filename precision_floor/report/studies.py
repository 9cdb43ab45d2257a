"""The studies a report is made of: per study, the summary it leaves in the store and the one command
that (re)generates it there (DIR = the store). ``python -m precision_floor.report`` runs exactly these
commands for the studies a store lacks; each report section names its command (README lists them)."""
from __future__ import annotations

ZOO_SUMMARY = "bugzoo-summary.json"
ZOO_RECORDS = "bugzoo-records.jsonl"

# study -> (file it leaves in the store, command that regenerates it)
STUDIES: dict[str, tuple[str, str]] = {
    "flips": ("flips.json", "python -m precision_floor.flips --records DIR"),
    "search": ("search.json", "python -m precision_floor.search --records DIR"),
    "bugzoo": (ZOO_SUMMARY, f"python -m parity.bugzoo --json DIR/{ZOO_SUMMARY} --records DIR/{ZOO_RECORDS}"),
    "attribution": ("attribution.json", "python -m precision_floor.attribution --records DIR"),
}

# report section -> the study whose records it shows
SECTION_STUDY = {"flips": "flips", "floor": "search", "layers": "search", "topk": "search",
                 "selection": "search", "bugzoo": "bugzoo", "attribution": "attribution"}


def study_main(study: str):
    """The ``main`` of the study's command (``python -m M ...``: M's main, or M.__main__'s for a package)."""
    import importlib

    name = STUDIES[study][1].split()[2]
    mod = importlib.import_module(name)
    return getattr(mod, "main", None) or importlib.import_module(name + ".__main__").main


def regenerate_command(section: str) -> str | None:
    study = SECTION_STUDY.get(section)
    return STUDIES[study][1] if study else None


__all__ = ["SECTION_STUDY", "STUDIES", "ZOO_RECORDS", "ZOO_SUMMARY", "regenerate_command", "study_main"]
