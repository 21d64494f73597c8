"""Which Megatron layer spec a run uses: printed once and written next to the resolved config
(rlinf.models.megatron.bridge.announce_spec), and RLINF_MEGATRON_TE=off (te_placeholder)."""

import json

import pytest

from rlinf.config.megatron_settings import translate
from rlinf.config.schema import ActorConfig, ModelConfig
from rlinf.models.megatron import te_placeholder
from rlinf.models.megatron.bridge import SPEC_RECORD_FILE, announce_spec, spec_record


@pytest.mark.parametrize(
    ("te_available", "spec", "attention"),
    [(True, "transformer_engine", "TEDotProductAttention"), (False, "te_free", "SDPACoreAttention")],
)
def test_the_spec_is_printed_once_and_written_next_to_the_resolved_config(
    tmp_path, capsys, te_available, spec, attention
):
    settings = translate(
        ActorConfig(training_backend="megatron", model=ModelConfig()), te_available=te_available
    )
    record = announce_spec(settings, te_available, str(tmp_path / "logs"))
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 1 and f"spec={spec}" in printed[0]
    written = json.loads((tmp_path / "logs" / SPEC_RECORD_FILE).read_text())
    assert written == record and written["spec"] == spec and written["core_attention"] == attention
    assert written["grouped_gemm_experts"] is te_available  # without TE: actor.model.moe_grouped_gemm (off)
    assert written["routed_experts"] == ("TEGroupedMLP" if te_available else "SequentialMLP")
    assert written["gradient_accumulation_fusion"] is te_available


@pytest.mark.parametrize("te_available", [True, False])
def test_the_record_names_rlinfs_grouped_experts_when_they_run(te_available):
    model = ModelConfig(moe_grouped_gemm=True, moe_grouped_gemm_impl="torch")
    settings = translate(ActorConfig(training_backend="megatron", model=model), te_available=te_available)
    record = spec_record(settings, te_available)
    assert record["routed_experts"] == "GroupedGemmExperts" and record["grouped_gemm_experts"] is True


def test_without_a_logs_folder_the_spec_is_only_printed(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = translate(ActorConfig(training_backend="megatron", model=ModelConfig()), te_available=False)
    announce_spec(settings, False, None)
    assert "spec=te_free" in capsys.readouterr().out and not list(tmp_path.iterdir())


@pytest.mark.parametrize(("value", "off"), [(None, False), ("auto", False), ("off", True), (" OFF ", True)])
def test_rlinf_megatron_te_switches_transformer_engine_off(monkeypatch, value, off):
    if value is None:
        monkeypatch.delenv(te_placeholder.SWITCH_ENV, raising=False)
    else:
        monkeypatch.setenv(te_placeholder.SWITCH_ENV, value)
    assert te_placeholder.te_switched_off() is off
    if off:
        assert te_placeholder.real_te_available() is False


def test_an_unknown_rlinf_megatron_te_value_is_refused(monkeypatch):
    monkeypatch.setenv(te_placeholder.SWITCH_ENV, "no")
    with pytest.raises(ValueError, match="RLINF_MEGATRON_TE='no': expected auto or off"):
        te_placeholder.te_switched_off()


@pytest.mark.parametrize(
    ("te_available", "override", "mode"),
    [(True, None, "tf32"), (True, "1", "tf32"), (True, "0", "exact"), (False, None, "exact")],
)
def test_an_fp32_actor_records_whether_its_gemms_are_exact(
    tmp_path, monkeypatch, caplog, te_available, override, mode
):
    from rlinf.models.megatron.fp32_gemms import OVERRIDE_ENV, exact_fp32_env

    if override is None:
        monkeypatch.delenv(OVERRIDE_ENV, raising=False)
    else:
        monkeypatch.setenv(OVERRIDE_ENV, override)
    settings = translate(
        ActorConfig(training_backend="megatron", model=ModelConfig()), te_available=te_available
    )
    with caplog.at_level("WARNING"):
        record = announce_spec(settings, te_available, str(tmp_path / "logs"), precision="fp32")
    assert record["fp32_gemms"] == mode
    assert (f"started without {OVERRIDE_ENV}=0" in caplog.text) is (mode == "tf32")
    assert "fp32_gemms" not in announce_spec(settings, te_available, None, precision="bf16")
    # what the runner starts an actor's processes with
    assert exact_fp32_env("fp32") == {OVERRIDE_ENV: "0"} and exact_fp32_env("bf16") == {}
