//! Calls written back to back (HTTP/1.1 pipelining) to a real master
//! process: the benches' Mesos v1 client keeps many ACKNOWLEDGEs in
//! flight that way, and a master must answer each in order, each with
//! its own status, without mixing them up or stalling.

mod support;

use std::time::Duration;

use agora_examples::mesos_v1_client::{self as v1c, CallPipeline, HttpVersion};
use agora_mesos_proto::convert;
use agora_mesos_proto::v1::scheduler::{call, Call};
use agora_mesos_proto::Codec;
use agora_proto::FrameworkInfo;
use support::TestCluster;

fn revive() -> Call {
    let mut call = Call {
        revive: Some(call::Revive::default()),
        ..Default::default()
    };
    call.set_type(call::Type::Revive);
    call
}

#[test]
fn pipelined_calls_to_a_master_are_each_answered_in_order() {
    let cluster = TestCluster::start(1, "cpus:2;mem:1024");
    let master = cluster.master_address();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        for codec in [Codec::Protobuf, Codec::Json] {
            let subscription = v1c::subscribe(
                &agora_client::Http::new(),
                &master,
                codec,
                convert::mesos_framework_info(&FrameworkInfo::new("pipelined")),
            )
            .await
            .expect("subscribed");
            let pipeline =
                CallPipeline::new(subscription.calls.clone(), 64, HttpVersion::Http1Pipelined);
            for _ in 0..20 {
                let batch: Vec<_> = (0..50)
                    .map(|i| {
                        if i % 2 == 0 {
                            v1c::suppress()
                        } else {
                            revive()
                        }
                    })
                    .collect();
                pipeline.send_all(batch).await;
            }
            tokio::time::timeout(Duration::from_secs(60), pipeline.drain())
                .await
                .expect("1000 pipelined calls answered");
            assert_eq!(pipeline.failure(), None, "{codec:?}");

            // A bad call in the middle of a burst is refused alone, with
            // its own answer: the ones around it are accepted.
            let pipeline =
                CallPipeline::new(subscription.calls.clone(), 64, HttpVersion::Http1Pipelined);
            let mut bad = v1c::suppress();
            bad.set_type(call::Type::Acknowledge);
            pipeline
                .send_all(vec![v1c::suppress(), bad, revive()])
                .await;
            pipeline.drain().await;
            let failure = pipeline.failure().expect("the bad call refused");
            assert!(failure.contains("ACKNOWLEDGE answered 400"), "{failure}");
            subscription
                .calls
                .call(v1c::teardown())
                .await
                .expect("teardown");
        }
    });
}
