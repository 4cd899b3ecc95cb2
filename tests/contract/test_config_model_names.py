"""Two [[model]] tables that name the same model, compared as ModelSpec.matches compares (case, a trailing '/',
the part after the last '/'), are refused like two profiles of one name: find_model takes the first, so an edit
of the second would silently change nothing."""

from __future__ import annotations

import pytest

from lynxtop.contract.config import ConfigError, parse_config
from lynxtop.contract.models import find_model

MODEL = '''[[model]]
name = "{name}"
params_b = {p}
layers = 32
attention_heads = 32
context_window = 32768
native_quantization = "bf16"
bytes_per_param = {{bf16 = 2.0}}
kv_heads = 8
head_dim = 128
'''


def test_duplicate_model_name_is_refused_naming_both_tables():
    with pytest.raises(ConfigError) as err:
        parse_config(MODEL.format(name="acme/m-7b", p=7) + MODEL.format(name="acme/m-7b", p=70), source="c.toml")
    assert err.value.problems == ["c.toml: model[1] (acme/m-7b).name: duplicate model name 'acme/m-7b' "
                                  "(first in model[0])"]


@pytest.mark.parametrize("second", ["ACME/M-7B", "other/m-7b", "m-7b"])
def test_a_name_the_first_table_matches_is_a_duplicate(second):
    with pytest.raises(ConfigError) as err:
        parse_config(MODEL.format(name="acme/m-7b", p=7) + MODEL.format(name=second, p=70), source="c.toml")
    (problem,) = err.value.problems
    assert problem.startswith(f"c.toml: model[1] ({second}).name: duplicate model name '{second}' "
                              "(first in model[0] as 'acme/m-7b'")


def test_distinct_names_and_a_built_in_override_are_accepted():
    cfg = parse_config(MODEL.format(name="acme/m-7b", p=7) + MODEL.format(name="acme/m-70b", p=70)
                       + '[[model]]\nname = "deepseek-ai/DeepSeek-V4.1"\noverhead_gib = 8\n')
    assert [m.name for m in cfg.models] == ["acme/m-7b", "acme/m-70b", "deepseek-ai/DeepSeek-V4.1"]
    assert find_model("acme/m-70b", cfg.models).params_b == 70
