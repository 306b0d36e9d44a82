import unicodedata

from pipeline.formats.control_chars import may_hold_control_chars, replace_control_chars


def test_control_character_rule():
    controls = [chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) == "Cc"]
    spaced = {c for c in controls if replace_control_chars(f"a{c}b") == ("a b", True)}
    assert spaced == set(controls) - {"\t", "\n", "\r"}
    assert replace_control_chars("caf\u00e9 \u00a0 \u200b\ufffd") == ("caf\u00e9 \u00a0 \u200b\ufffd", False)
    assert not may_hold_control_chars("caf\u00e9 \u00a0 \u00bf \t\r\n".encode())
    assert all(may_hold_control_chars(f"x{c}y".encode()) for c in spaced)
