"""Measured figures come from `make bench`'s output, never copied by hand (issue 50 item 4): docs/benchmarks.md's table
of latest figures is what `bench.figures` renders from bench/results/, and the rule that picks a figure's latest value
is the one its docstring states."""

from __future__ import annotations

from bench import figures


def test_the_pages_latest_figures_are_the_results_files():
    text = figures.PAGE.read_text()
    assert figures.page_with(text, figures.render(figures.latest())) == text, "run: python -m bench.figures"


def test_the_newest_file_wins_and_a_files_own_run_comes_first(tmp_path):
    (tmp_path / "lab-2026-12-01-a.txt").write_text("bench.commit: x\ndeploy.noop_vs_floor: 1.90\nenv.noop_s: 0.40\n")
    (tmp_path / "lab-2026-12-03-b.txt").write_text("deploy.noop_vs_floor: 1.50\n# Earlier runs:\ndeploy.noop_vs_floor: 1.70\n")
    (tmp_path / "lab-2026-12-02-c.txt").write_text("deploy.noop_vs_floor: 1.60\n")
    (tmp_path / "h200-2026-12-09-gpu.txt").write_text("deploy.noop_vs_floor: 9.99\n")  # not a lab run
    found = figures.latest(tmp_path)
    assert found == {"deploy.noop_vs_floor": ("1.50", "lab-2026-12-03-b.txt"), "env.noop_s": ("0.40", "lab-2026-12-01-a.txt")}
    table = figures.render(found)
    assert "| `deploy.noop_vs_floor` | 1.50 | `bench/results/lab-2026-12-03-b.txt` |" in table and "bench.commit" not in table


def test_a_stale_table_is_caught(monkeypatch, tmp_path, capsys):
    page = tmp_path / "benchmarks.md"
    page.write_text(f"# B\n\n{figures.BEGIN}\n| `x.y` | 1 | hand |\n{figures.END}\n")
    monkeypatch.setattr(figures, "PAGE", page)
    monkeypatch.setattr(figures, "ROOT", tmp_path)
    assert figures.main(["--check"]) == 1
    assert figures.main([]) == 0 and figures.main(["--check"]) == 0
    assert "hand" not in page.read_text()
