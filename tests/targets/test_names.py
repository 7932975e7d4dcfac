"""Kubernetes names (targets/_names.py): DNS-1123 labels, trimmed from the left as cdk8s
trims them, so that long names keep the part that tells them apart."""

from compiler.names import DNS_LABEL, MAX_LABEL, dns_label


def test_short_names_are_kept_whole():
    assert dns_label("DeepSeek-V4.1-Flash", "decode") == "deepseek-v4-1-flash-decode"


def test_long_names_keep_their_tail_and_stay_unique():
    long = "a-very-long-deployment-name-that-a-team-wrote-for-its-own-cluster"
    a, b = dns_label(long, "prefill-00"), dns_label(long, "prefill-01")
    for name in (a, b):
        assert len(name) <= MAX_LABEL and DNS_LABEL.fullmatch(name)
    assert a != b
    assert a[:-9].endswith("prefill-00") and b[:-9].endswith("prefill-01")


def test_a_cut_never_starts_with_a_dash():
    name = dns_label("a" * 20, "b" * 53)  # the cut falls on the joining dash
    assert DNS_LABEL.fullmatch(name) and name.startswith("b" * 53 + "-")
