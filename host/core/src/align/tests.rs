use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ContainerPort, PodIP, PodSpec, PodStatus, ServiceSpec};

use super::*;

fn meta(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> ObjectMeta {
    let map = |kv: &[(&str, &str)]| {
        Some(
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        )
    };
    ObjectMeta {
        labels: map(labels),
        annotations: map(annotations),
        ..Default::default()
    }
}

fn cport(name: &str, port: i32, proto: Option<&str>) -> ContainerPort {
    ContainerPort {
        name: Some(name.into()),
        container_port: port,
        protocol: proto.map(Into::into),
        ..Default::default()
    }
}

fn container(ports: Vec<ContainerPort>) -> Container {
    Container {
        name: "c".into(),
        ports: Some(ports),
        ..Default::default()
    }
}

fn pod_with(containers: Vec<Container>, init: Vec<Container>, ips: &[&str]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("p".into()),
            namespace: Some("ns".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers,
            init_containers: Some(init),
            ..Default::default()
        }),
        status: Some(PodStatus {
            pod_ip: ips.first().map(|s| s.to_string()),
            pod_ips: Some(ips.iter().map(|ip| PodIP { ip: ip.to_string() }).collect()),
            phase: Some("Running".into()),
            ..Default::default()
        }),
    }
}

fn sport(name: &str, port: i32, target: Option<IntOrString>, proto: Option<&str>) -> ServicePort {
    ServicePort {
        name: Some(name.into()),
        port,
        target_port: target,
        protocol: proto.map(Into::into),
        ..Default::default()
    }
}

fn named(s: &str) -> Option<IntOrString> {
    Some(IntOrString::String(s.into()))
}

#[test]
fn key_value_reads_label_or_annotation() {
    let m = meta(&[("g", "label-val")], &[("g", "ann-val")]);
    assert_eq!(
        key_value(&m, &KeySource::Label("g".into())),
        Some("label-val")
    );
    assert_eq!(
        key_value(&m, &KeySource::Annotation("g".into())),
        Some("ann-val")
    );
    assert_eq!(key_value(&m, &KeySource::Label("other".into())), None);
    assert_eq!(
        key_value(&ObjectMeta::default(), &KeySource::Annotation("g".into())),
        None
    );
}

#[test]
fn families_follow_spec_and_default_to_v4() {
    let svc = |fams: Option<Vec<&str>>, cip: Option<&str>| Service {
        spec: Some(ServiceSpec {
            ip_families: fams.map(|f| f.into_iter().map(String::from).collect()),
            cluster_ip: cip.map(Into::into),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(
        families(&svc(Some(vec!["IPv6", "IPv4"]), None)),
        vec![Family::V6, Family::V4]
    );
    assert_eq!(families(&svc(Some(vec!["IPv4"]), None)), vec![Family::V4]);
    assert_eq!(families(&svc(None, None)), vec![Family::V4]);
    assert_eq!(families(&svc(Some(vec![]), Some("None"))), vec![Family::V4]);
    assert_eq!(families(&svc(None, Some("fd00::1"))), vec![Family::V6]);
    assert_eq!(families(&Service::default()), vec![Family::V4]);
}

#[test]
fn pod_address_per_family_with_mapped_normalisation() {
    let p = pod_with(vec![], vec![], &["10.244.0.5", "fd00:10:244::5"]);
    assert_eq!(
        pod_address(&p, Family::V4),
        Some("10.244.0.5".parse().unwrap())
    );
    assert_eq!(
        pod_address(&p, Family::V6),
        Some("fd00:10:244::5".parse().unwrap())
    );

    let mapped = pod_with(vec![], vec![], &["::ffff:10.244.0.7"]);
    assert_eq!(
        pod_address(&mapped, Family::V4),
        Some("10.244.0.7".parse().unwrap())
    );
    assert_eq!(pod_address(&mapped, Family::V6), None);

    let mut legacy = pod_with(vec![], vec![], &[]);
    legacy.status.as_mut().unwrap().pod_ips = None;
    legacy.status.as_mut().unwrap().pod_ip = Some("10.244.0.9".into());
    assert_eq!(
        pod_address(&legacy, Family::V4),
        Some("10.244.0.9".parse().unwrap())
    );

    let sloppy = pod_with(vec![], vec![], &["010.244.000.011"]);
    assert_eq!(
        pod_address(&sloppy, Family::V4),
        Some("10.244.0.11".parse().unwrap())
    );

    let none = pod_with(vec![], vec![], &[]);
    assert_eq!(pod_address(&none, Family::V4), None);
    assert_eq!(pod_address(&Pod::default(), Family::V4), None);
}

#[test]
fn addresses_endpoints_may_not_have_are_skipped() {
    for bad in [
        "0.0.0.0",
        "127.0.0.1",
        "127.9.9.9",
        "169.254.169.254",
        "224.0.0.251",
        "::",
        "::1",
        "fe80::1",
        "febf::1",
        "ff02::1",
        "ff12::2",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
    ] {
        let p = pod_with(vec![], vec![], &[bad]);
        for family in [Family::V4, Family::V6] {
            assert_eq!(pod_address(&p, family), None, "{bad}");
        }
    }
    for good in [
        "10.244.0.5",
        "192.168.1.1",
        "224.0.1.1",
        "fd00:10:244::5",
        "2001:db8::1",
        "fec0::1",
        "ff05::2",
    ] {
        let ip: IpAddr = good.parse().unwrap();
        assert!(is_endpoint_address(ip), "{good}");
    }
    // Metadata services outside link-local (issue 45 item 5): neither
    // probed nor published.
    for bad in [
        "168.63.129.16",
        "100.100.100.200",
        "fd00:ec2::254",
        "fd00:ec2::253",
        "fd00:ec2::123",
        "64:ff9b::a9fe:a9fe",
        "64:ff9b::7f00:1",
        "64:ff9b::a83f:8110",
        "::ffff:168.63.129.16",
    ] {
        let p = pod_with(vec![], vec![], &[bad]);
        for family in [Family::V4, Family::V6] {
            assert_eq!(pod_address(&p, family), None, "{bad}");
        }
        assert!(pod_addresses(&p).is_empty(), "{bad}");
    }
    for good in [
        "100.100.100.201",
        "168.63.129.17",
        "fd00:ec2::1",
        "fd00:ec2:1::254",
        "64:ff9b::a00:5",
    ] {
        let ip: IpAddr = good.parse().unwrap();
        assert!(!is_metadata_address(ip), "{good}");
    }
    // A bad first address does not hide a good one of the other family.
    let dual = pod_with(vec![], vec![], &["169.254.0.1", "fd00:10:244::7"]);
    assert_eq!(pod_address(&dual, Family::V4), None);
    assert_eq!(
        pod_address(&dual, Family::V6),
        Some("fd00:10:244::7".parse().unwrap())
    );
}

#[test]
fn terminal_pods_are_not_candidates() {
    let mut p = pod_with(vec![], vec![], &["10.0.0.1"]);
    assert!(is_candidate(&p));
    for (phase, want) in [
        ("Pending", true),
        ("Unknown", true),
        ("Succeeded", false),
        ("Failed", false),
    ] {
        p.status.as_mut().unwrap().phase = Some(phase.into());
        assert_eq!(is_candidate(&p), want, "{phase}");
    }
    assert!(is_candidate(&Pod::default()));
}

#[test]
fn numeric_and_unset_target_ports() {
    let p = pod_with(vec![], vec![], &["10.0.0.1"]);
    assert_eq!(resolve_target(&sport("a", 80, None, None), &p), Some(80));
    assert_eq!(
        resolve_target(&sport("a", 80, Some(IntOrString::Int(8080)), None), &p),
        Some(8080)
    );
    assert_eq!(
        resolve_target(&sport("a", 80, Some(IntOrString::Int(0)), None), &p),
        Some(80)
    );
    assert_eq!(
        resolve_target(&sport("a", 80, named(""), None), &p),
        Some(80)
    );
    assert_eq!(
        resolve_target(&sport("a", 80, Some(IntOrString::Int(70000)), None), &p),
        None
    );
}

#[test]
fn named_target_port_matches_name_and_protocol() {
    let p = pod_with(
        vec![
            container(vec![
                cport("dns", 5353, Some("UDP")),
                cport("web", 8080, None),
            ]),
            container(vec![cport("dns", 5354, Some("TCP"))]),
        ],
        vec![],
        &["10.0.0.1"],
    );
    // empty protocol on both sides means TCP
    assert_eq!(
        resolve_target(&sport("http", 80, named("web"), None), &p),
        Some(8080)
    );
    assert_eq!(
        resolve_target(&sport("http", 80, named("web"), Some("TCP")), &p),
        Some(8080)
    );
    assert_eq!(
        resolve_target(&sport("http", 80, named("web"), Some("UDP")), &p),
        None
    );
    // same name, different protocol: picks the matching one across containers
    assert_eq!(
        resolve_target(&sport("dns", 53, named("dns"), Some("UDP")), &p),
        Some(5353)
    );
    assert_eq!(
        resolve_target(&sport("dns", 53, named("dns"), None), &p),
        Some(5354)
    );
    assert_eq!(
        resolve_target(&sport("x", 53, named("missing"), None), &p),
        None
    );
}

#[test]
fn named_target_port_in_sidecar_only() {
    let mut sidecar = container(vec![cport("metrics", 9090, None)]);
    sidecar.restart_policy = Some("Always".into());
    let plain_init = container(vec![cport("setup", 7070, None)]);
    let p = pod_with(
        vec![container(vec![cport("web", 8080, None)])],
        vec![plain_init, sidecar],
        &["10.0.0.1"],
    );
    assert_eq!(
        resolve_target(&sport("m", 90, named("metrics"), None), &p),
        Some(9090)
    );
    // a run-to-completion init container does not serve
    assert_eq!(
        resolve_target(&sport("s", 70, named("setup"), None), &p),
        None
    );
    // regular containers win over sidecars
    let mut dup = container(vec![cport("web", 9999, None)]);
    dup.restart_policy = Some("Always".into());
    let p2 = pod_with(
        vec![container(vec![cport("web", 8080, None)])],
        vec![dup],
        &["10.0.0.1"],
    );
    assert_eq!(
        resolve_target(&sport("w", 80, named("web"), None), &p2),
        Some(8080)
    );
}

#[test]
fn a_host_network_pod_may_be_probed_only_on_the_ports_its_service_resolves() {
    let svc = Service {
        spec: Some(ServiceSpec {
            ports: Some(vec![
                sport("http", 80, named("web"), None),
                sport("admin", 9000, Some(IntOrString::Int(9001)), None),
                sport("gone", 81, named("missing"), None),
            ]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut pod = pod_with(
        vec![container(vec![cport("web", 8080, None)])],
        vec![],
        &["10.0.0.1"],
    );
    assert_eq!(
        probe_ports(&svc, &pod),
        None,
        "an address of its own: any port"
    );
    pod.spec.as_mut().unwrap().host_network = Some(true);
    assert_eq!(probe_ports(&svc, &pod), Some(BTreeSet::from([8080, 9001])));
    pod.spec.as_mut().unwrap().host_network = Some(false);
    assert_eq!(probe_ports(&svc, &pod), None);
}

#[test]
fn subjects_cover_ports_families_and_candidates() {
    let svc = Arc::new(Service {
        metadata: ObjectMeta {
            name: Some("s".into()),
            namespace: Some("ns".into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            ip_families: Some(vec!["IPv4".into(), "IPv6".into()]),
            ports: Some(vec![
                sport("http", 80, named("web"), None),
                sport("admin", 9000, Some(IntOrString::Int(9001)), None),
            ]),
            ..Default::default()
        }),
        ..Default::default()
    });
    let dual = pod_with(
        vec![container(vec![cport("web", 8080, None)])],
        vec![],
        &["10.0.0.1", "fd00::1"],
    );
    let v4_only_no_web = {
        let mut p = pod_with(vec![], vec![], &["10.0.0.2"]);
        p.metadata.name = Some("q".into());
        p
    };
    let failed = {
        let mut p = pod_with(
            vec![container(vec![cport("web", 8080, None)])],
            vec![],
            &["10.0.0.3"],
        );
        p.status.as_mut().unwrap().phase = Some("Failed".into());
        p
    };
    let other_ns = {
        let mut p = pod_with(
            vec![container(vec![cport("web", 8080, None)])],
            vec![],
            &["10.0.0.4"],
        );
        p.metadata.namespace = Some("elsewhere".into());
        p
    };
    let pods: Vec<Arc<Pod>> = [dual, v4_only_no_web, failed, other_ns]
        .into_iter()
        .map(Arc::new)
        .collect();
    let got: Vec<(String, u16, Family, String)> = subjects(&svc, &pods, &PodAddresses::default())
        .into_iter()
        .map(|s| (s.port.name, s.port.target, s.family, s.address.to_string()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("http".into(), 8080, Family::V4, "10.0.0.1".into()),
            ("http".into(), 8080, Family::V6, "fd00::1".into()),
            ("admin".into(), 9001, Family::V4, "10.0.0.1".into()),
            ("admin".into(), 9001, Family::V4, "10.0.0.2".into()),
            ("admin".into(), 9001, Family::V6, "fd00::1".into()),
        ]
    );
    let s = &subjects(&svc, &pods, &PodAddresses::default())[0];
    assert_eq!(s.port.protocol, "TCP");
    assert_eq!(s.port.port, 80);
}

fn dual_stack_web() -> Arc<Service> {
    Arc::new(Service {
        metadata: ObjectMeta {
            name: Some("s".into()),
            namespace: Some("ns".into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            ip_families: Some(vec!["IPv4".into(), "IPv6".into()]),
            ports: Some(vec![sport("http", 80, named("web"), None)]),
            ..Default::default()
        }),
        ..Default::default()
    })
}

fn cidrs(list: &[&str]) -> PodAddresses {
    PodAddresses {
        cidrs: list.iter().map(|c| c.parse().unwrap()).collect(),
        host_network: false,
    }
}

fn judged(svc: &Arc<Service>, pod: &Pod, addresses: &PodAddresses) -> Vec<String> {
    subjects(svc, &[Arc::new(pod.clone())], addresses)
        .into_iter()
        .map(|s| s.address.to_string())
        .collect()
}

#[test]
fn addresses_outside_the_pod_cidrs_are_neither_probed_nor_published() {
    let svc = dual_stack_web();
    let web = || vec![container(vec![cport("web", 8080, None)])];
    let known = |_: &str| true;
    let pods = cidrs(&["10.244.0.0/16", "fd00:10:244::/64"]);

    let inside = pod_with(web(), vec![], &["10.244.0.7", "fd00:10:244::7"]);
    assert_eq!(
        judged(&svc, &inside, &pods),
        ["10.244.0.7", "fd00:10:244::7"]
    );
    assert_eq!(not_judged(&svc, &inside, &known, &pods), None);

    // Status claims the apiserver's address and a ClusterIP.
    let outside = pod_with(web(), vec![], &["10.96.0.1", "fd00:10:96::1"]);
    assert!(judged(&svc, &outside, &pods).is_empty());
    assert_eq!(
        not_judged(&svc, &outside, &known, &pods),
        Some(NotJudged::OutsideCidrs)
    );
    assert_eq!(
        judged(&svc, &outside, &PodAddresses::default()).len(),
        2,
        "no cidrs: any address"
    );

    // One family inside: judged in that family only.
    let half = pod_with(web(), vec![], &["10.244.0.8", "fd00:10:96::8"]);
    assert_eq!(judged(&svc, &half, &pods), ["10.244.0.8"]);
    assert_eq!(not_judged(&svc, &half, &known, &pods), None);

    // A pod with no address yet is still "no address", not "outside".
    let starting = pod_with(web(), vec![], &[]);
    assert_eq!(
        not_judged(&svc, &starting, &known, &pods),
        Some(NotJudged::NoAddress)
    );
}

#[test]
fn host_network_pods_are_judged_only_when_the_configuration_says_so() {
    let svc = dual_stack_web();
    let known = |_: &str| true;
    let mut pod = pod_with(
        vec![container(vec![cport("web", 8080, None)])],
        vec![],
        &["192.168.1.10"],
    );
    pod.spec.as_mut().unwrap().host_network = Some(true);

    for off in [PodAddresses::default(), cidrs(&["10.244.0.0/16"])] {
        assert!(judged(&svc, &pod, &off).is_empty());
        assert_eq!(
            not_judged(&svc, &pod, &known, &off),
            Some(NotJudged::HostNetwork)
        );
    }
    // Opted in, the Node's address is judged: no pod CIDR holds it, and
    // `hostNetwork` alone decides for such pods.
    let mut on = cidrs(&["10.244.0.0/16"]);
    on.host_network = true;
    assert_eq!(judged(&svc, &pod, &on), ["192.168.1.10"]);
    assert_eq!(not_judged(&svc, &pod, &known, &on), None);
    // A terminal pod stays terminal, whatever its network.
    pod.status.as_mut().unwrap().phase = Some("Succeeded".into());
    assert_eq!(
        not_judged(&svc, &pod, &known, &on),
        Some(NotJudged::Terminal)
    );
}
