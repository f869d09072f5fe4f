//! The catalogue's tests: defaults that parse, flags that agree, and the
//! rules of values and of a job's given parameters.

use super::table::p;
use super::*;

#[test]
fn every_default_parses_on_both_devices() {
    for p in PARAMS {
        for gpu in [true, false] {
            if let Some(d) = p.default.for_device(gpu) {
                parse_value(p, d).unwrap_or_else(|e| panic!("{} default {d}: {e}", p.name));
            }
        }
    }
}

#[test]
fn a_name_is_one_kind_of_flag() {
    // Two entries of one name share a flag: they must agree on being a bool
    // and must not both serve one workload.
    for a in PARAMS {
        for b in PARAMS.iter().filter(|b| b.name == a.name) {
            assert_eq!(matches!(a.kind, Kind::Bool), matches!(b.kind, Kind::Bool));
            if !std::ptr::eq(a, b) {
                assert!(
                    a.workloads.iter().all(|w| !b.workloads.contains(w)),
                    "{}",
                    a.name
                );
            }
        }
    }
}

#[test]
fn booleans_follow_one_rule() {
    for (t, want) in [
        ("true", true),
        ("1", true),
        ("YES", true),
        ("no", false),
        ("0", false),
    ] {
        assert_eq!(parse_bool(t).unwrap(), want, "{t}");
    }
    assert!(parse_bool("maybe").unwrap_err().contains("true or false"));
    let mut given = std::collections::HashMap::new();
    given.insert("with_comm".to_string(), "yes".to_string());
    assert_eq!(check_given("stress", &given).unwrap()["with_comm"], "true");
}

#[test]
fn flag_help_says_the_default() {
    assert_eq!(
        flag_help("max_bytes"),
        "nccl: largest message size (default 1G on GPU, 16M on CPU)"
    );
    assert!(
        flag_help("precision").contains("stress: ")
            && flag_help("precision").contains("ddp/fsdp/maxbatch: ")
    );
}

#[test]
fn pairs_need_two_nodes_when_the_count_is_known() {
    let mut given = std::collections::HashMap::new();
    given.insert("pattern".to_string(), "pairs".to_string());
    let e = check_shape("nccl", &given, Some(1)).unwrap_err();
    assert_eq!(e.field, "--pattern");
    assert!(e.message.contains("2 nodes or more"), "{e}");
    assert!(check_shape("nccl", &given, Some(2)).is_ok());
    assert!(check_shape("nccl", &given, None).is_ok());
    // Sizes: pairs measure at max_bytes only, so min_bytes above it is no error.
    given.insert("min_bytes".to_string(), "2M".to_string());
    given.insert("max_bytes".to_string(), "1M".to_string());
    assert!(check_given("nccl", &given).is_ok());
    given.remove("pattern");
    assert_eq!(
        check_given("nccl", &given).unwrap_err().field,
        "--min-bytes"
    );
    given.remove("min_bytes");
    given.insert("pattern".to_string(), "all".to_string());
    assert!(check_shape("nccl", &given, Some(1)).is_ok());
    assert!(check_shape("stress", &std::collections::HashMap::new(), Some(1)).is_ok());
}

#[test]
fn bisect_needs_three_nodes_when_the_count_is_known() {
    let mut given = std::collections::HashMap::new();
    given.insert("pattern".to_string(), "bisect".to_string());
    for n in [1, 2] {
        let e = check_shape("nccl", &given, Some(n)).unwrap_err();
        assert_eq!(e.field, "--pattern");
        assert!(e.message.contains("3 nodes or more"), "{e}");
    }
    assert!(check_shape("nccl", &given, Some(3)).is_ok());
    assert!(check_shape("nccl", &given, None).is_ok());
    // One size, like pairs: min_bytes above max_bytes is no error.
    given.insert("min_bytes".to_string(), "2M".to_string());
    given.insert("max_bytes".to_string(), "1M".to_string());
    assert!(check_given("nccl", &given).is_ok());
    assert!(flag_help("pattern").contains("bisect"));
}

#[test]
fn sequences_are_bounded() {
    const WORDS: &[&str] = &["a", "b", "c", "d", "e", "f", "g", "h", "i"];
    let p = p(
        "x",
        Kind::Sequence {
            words: WORDS,
            max: 8,
        },
        "",
        DefaultValue::None,
        "",
        &[],
    );
    assert_eq!(
        parse_value(&p, "c,a").unwrap(),
        Value::List(vec!["c".into(), "a".into()])
    );
    let e = parse_value(&p, &WORDS.join(",")).unwrap_err();
    assert!(e.contains("9 given; at most 8"), "{e}");
    assert!(parse_value(&p, "a,b,a").unwrap_err().contains("twice"));
    assert!(param("ddp", "model").is_some_and(|p| matches!(p.kind, Kind::Sequence { .. })));
    assert!(param("maxbatch", "model").is_some_and(|p| matches!(p.kind, Kind::Choice(_))));
}

#[test]
fn a_sweep_takes_its_settings_or_auto_alone() {
    let p = param("ddp", "loader_workers").unwrap();
    assert_eq!(
        parse_value(p, "0,4").unwrap(),
        Value::List(vec!["0".into(), "4".into()])
    );
    assert_eq!(
        parse_value(p, "auto").unwrap(),
        Value::List(vec![AUTO.into()])
    );
    let e = parse_value(p, "auto,4").unwrap_err();
    assert!(
        e.contains("`auto` is not a whole number") && e.contains("alone"),
        "{e}"
    );
    assert!(parse_value(p, "65").is_err());
}

#[test]
fn memory_targets() {
    assert_eq!(parse_memory("0.8").unwrap(), MemoryTarget::Fraction(0.8));
    assert_eq!(parse_memory("20").unwrap(), MemoryTarget::Bytes(20 << 30));
    assert_eq!(parse_memory("1G").unwrap(), MemoryTarget::Bytes(1 << 30));
    assert!(parse_memory("-3").is_err());
}
