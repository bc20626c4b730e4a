import json

import pytest

from pallas_tools.evaluate import main


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


SMALL = ["Netflix/Driving/animated-RickandMorty/B_2019.11.21_10.20.17.csv",
         "Netflix/Driving/animated-RickandMorty/B_2019.11.21_09.03.55.csv"]


def test_smoke_on_two_real_drives(ucc_dir, tmp_path, capsys):
    # two short real drives (linked, not copied), leave-one-drive-out between them
    folder = tmp_path / "drives"
    folder.mkdir()
    for rel in SMALL:
        (folder / rel.rsplit("/", 1)[1]).symlink_to(ucc_dir / rel)
    png = tmp_path / "tavail.png"
    assert main([str(folder), "--modes", "history,combined", "--plot", str(png)]) == 0
    s = _last_json(capsys.readouterr().out)
    assert s["_meta"]["drives"] == 2 and s["_meta"]["protocol"] == "leave-one-drive-out"
    for m in ("history", "combined"):
        c = s[m]["connected"]
        assert c["n"] > 0 and 0.0 <= c["right@2"] <= 1.0 and s[m]["false_alarms_per_h"] >= 0
    assert png.stat().st_size > 1000


def test_map_from_other_folder(ucc_dir, capsys):
    # score one short drive with the knowledge of the other
    assert main([str(ucc_dir / SMALL[0]), "--map-from", str(ucc_dir / SMALL[1]), "--modes", "places"]) == 0
    s = _last_json(capsys.readouterr().out)
    assert s["_meta"]["protocol"] == "map-from" and "places" in s


@pytest.mark.slow
def test_generated_drives(capsys):
    assert main(["--generate", "2", "--routes", "1", "--duration", "120", "--modes", "a3,combined"]) == 0
    s = _last_json(capsys.readouterr().out)
    assert s["_meta"]["tol_s"] == 0.5 and s["a3"]["connected"]["n"] > 0
    # with full reports the combination names most targets 1 s ahead
    assert s["combined"]["connected"]["right@1"] >= 0.5


def test_bad_arguments(tmp_path):
    with pytest.raises(SystemExit):
        main([])
    assert main([str(tmp_path)]) == 2      # an empty folder: nothing to score


def test_config_overrides_merge_nested_keys_and_bad_ones_exit_2(tmp_path, capsys):
    """``--config`` changes only the keys it names, nested objects included (the rest keep the
    profile's values), and a wrong value is one line on stderr and exit status 2."""
    import json as _json

    from pallas_tools.evaluate import main as evaluate_main

    ok = tmp_path / "ok.json"
    ok.write_text('{"stability": {"hold_s": 0.25}}')
    assert evaluate_main(["--generate", "1", "--duration", "60", "--modes", "combined", "--config", str(ok)]) == 0
    cfg = _json.loads(capsys.readouterr().out.strip().splitlines()[-1])["_meta"]["config"]
    assert cfg["stability"] == {"hold_s": 0.25, "switch_margin": 0.3, "drop_after_s": 1.0}
    bad = tmp_path / "bad.json"
    bad.write_text('{"stability": {"hold_s": "x"}}')
    assert evaluate_main(["--generate", "1", "--duration", "60", "--config", str(bad)]) == 2
    assert "--config.stability.hold_s" in capsys.readouterr().err
