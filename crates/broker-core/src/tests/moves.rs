//! What a topic moving to another state takes with it, and what ties it to others.

use super::broker;
use crate::{GroupSetting, NameRules, TopicName};

/// Settings giving a group `dead_letter` as its dead-letter topic.
fn dead_letter(name: &str) -> [GroupSetting; 2] {
    [
        GroupSetting::MaxDeliveries(2),
        GroupSetting::DeadLetter(TopicName::with_rules(name, NameRules::Broker).unwrap()),
    ]
}

#[test]
fn dead_letter_ties_name_both_sides_whether_created_or_not() {
    let b = broker(10);
    for topic in ["orders", "payments", "audit", "alone"] {
        b.create(topic, 1).unwrap();
    }
    // Orders' group names a topic not created yet; payments' group names orders.
    b.join_group("orders", "g", "m", None, &dead_letter("orders-dlq"))
        .unwrap();
    b.join_group("payments", "g", "m", None, &dead_letter("orders"))
        .unwrap();
    b.join_group("audit", "g", "m", None, &[]).unwrap();
    b.with_state(|state| {
        assert_eq!(state.dead_letter_ties("orders"), ["orders-dlq", "payments"]);
        assert_eq!(state.dead_letter_ties("payments"), ["orders"]);
        assert!(state.dead_letter_ties("audit").is_empty());
        assert!(state.dead_letter_ties("alone").is_empty());
        assert!(state.dead_letter_ties("nowhere").is_empty());
    });
}

#[test]
fn an_imported_topic_is_refused_where_its_name_exists_or_the_topics_are_at_their_most() {
    let from = broker(10);
    from.create("t", 2).unwrap();
    from.publish("t", 1, "a").unwrap();
    let image = from.with_state(|state| state.export_topic("t")).unwrap();
    let to = broker(10);
    to.create("t", 1).unwrap();
    let refused = to.with_state(|state| state.import_topic("t", image.clone()));
    assert!(refused.is_err());
    assert_eq!(
        to.describe().topics[0].partitions.len(),
        1,
        "left as it was"
    );
    let full = broker(10);
    full.with_state(|state| {
        let limits = crate::Limits {
            max_topics: 0,
            ..state.limits()
        };
        *state = std::mem::replace(state, crate::BrokerState::new(10).unwrap()).with_limits(limits);
        assert!(state.import_topic("t", image.clone()).is_err());
        assert!(state.export_topic("t").is_err(), "nothing imported");
    });
    let empty = broker(10);
    empty
        .with_state(|state| state.import_topic("t", image))
        .unwrap();
    assert_eq!(empty.end_offset("t", 1).unwrap(), 1);
}
