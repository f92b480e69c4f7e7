//! What the `aws` provider's tests run against: the moto EC2 emulator in
//! server mode on loopback (installed by `scripts/moto`), a recording proxy
//! in front of it that can also answer a call with an EC2 error (to play
//! throttling), an IMDSv2 endpoint per instance that serves that instance's
//! user data and ID, an EC2 client for the test's own checks, and the data
//! plane of the Network Load Balancers moto only records (see
//! [`ElbDataPlane`]).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_ec2::types::{Filter, InstanceAttributeName, InstanceStateName};
use base64::Engine as _;

use crate::{free_port, wait_for};

/// The region every test uses.
pub const REGION: &str = "us-east-1";

/// What the test's own SDK clients use: `endpoint` (moto), the test
/// region and moto's dummy credentials.
fn sdk_config(endpoint: &str) -> aws_types::SdkConfig {
    let credentials =
        aws_sdk_ec2::config::Credentials::new("testing", "testing", None, None, "drover-tests");
    aws_types::SdkConfig::builder()
        .behavior_version(aws_sdk_ec2::config::BehaviorVersion::latest())
        .region(aws_types::region::Region::new(REGION))
        .endpoint_url(endpoint)
        .credentials_provider(aws_types::sdk_config::SharedCredentialsProvider::new(
            credentials,
        ))
        .build()
}

/// A moto server on a loopback port, killed on drop.
pub struct Moto {
    pub url: String,
    child: Child,
    log: PathBuf,
}

impl Moto {
    /// Starts moto (installing it into `.venv/moto` on first use) with AMI
    /// validation on, so an unknown AMI fails as it does on EC2.
    pub fn start(log_dir: &std::path::Path) -> Self {
        Self::start_on(log_dir, "127.0.0.1")
    }

    /// Starts moto listening on `host` (an address of this host: loopback,
    /// or the gateway of a Docker network the test made, so its containers
    /// reach it too).
    pub fn start_on(log_dir: &std::path::Path, host: &str) -> Self {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let script = root.join("scripts/moto");
        let status = Command::new(&script)
            .arg("install")
            .status()
            .expect("run scripts/moto install");
        assert!(status.success(), "scripts/moto install failed");
        let port = free_port();
        let log = log_dir.join("moto.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(&script)
            .args(["serve", &port.to_string(), host])
            .env("MOTO_ENABLE_AMI_VALIDATION", "true")
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .expect("start moto");
        let url = format!("http://{host}:{port}");
        let probe = format!("{host}:{port}");
        wait_for("moto to listen", Duration::from_secs(60), || {
            std::net::TcpStream::connect(&probe)
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
        Self { url, child, log }
    }

    /// moto's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One bucket of a moto server, through the SDK (path-style), for a test's
/// own looks at what the coordinator and machines put there.
pub struct S3Bucket {
    pub name: String,
    client: aws_sdk_s3::Client,
    rt: tokio::runtime::Runtime,
}

impl S3Bucket {
    /// Creates bucket `name` on the moto at `endpoint`.
    pub fn create(endpoint: &str, name: &str) -> Self {
        let config = aws_sdk_s3::config::Builder::from(&sdk_config(endpoint))
            .force_path_style(true)
            .build();
        let bucket = Self {
            name: name.to_owned(),
            client: aws_sdk_s3::Client::from_conf(config),
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
        };
        bucket
            .rt
            .block_on(bucket.client.create_bucket().bucket(name).send())
            .unwrap_or_else(|e| panic!("create bucket {name}: {e:?}"));
        bucket
    }

    /// Every key in the bucket, sorted.
    pub fn keys(&self) -> Vec<String> {
        let listed = self
            .rt
            .block_on(self.client.list_objects_v2().bucket(&self.name).send())
            .unwrap_or_else(|e| panic!("list bucket {}: {e:?}", self.name));
        let mut keys: Vec<String> = listed
            .contents()
            .iter()
            .filter_map(|o| o.key().map(str::to_owned))
            .collect();
        keys.sort();
        keys
    }

    /// The object at `key`.
    pub fn get(&self, key: &str) -> Vec<u8> {
        self.rt.block_on(async {
            let answer = self
                .client
                .get_object()
                .bucket(&self.name)
                .key(key)
                .send()
                .await
                .unwrap_or_else(|e| panic!("get {key}: {e:?}"));
            answer.body.collect().await.unwrap().into_bytes().to_vec()
        })
    }

    /// Replaces the object at `key` with `body`.
    pub fn put(&self, key: &str, body: Vec<u8>) {
        self.rt
            .block_on(
                self.client
                    .put_object()
                    .bucket(&self.name)
                    .key(key)
                    .body(body.into())
                    .send(),
            )
            .unwrap_or_else(|e| panic!("put {key}: {e:?}"));
    }
}

/// One EC2 API call the proxy saw: its action and form parameters.
#[derive(Debug, Clone)]
pub struct Call {
    pub action: String,
    pub params: BTreeMap<String, String>,
}

struct ProxyState {
    upstream: String,
    /// Plain HTTP to moto; reqwest still wants a TLS configuration.
    client: reqwest::Client,
    calls: Mutex<Vec<Call>>,
    /// Action → (calls left to fail, HTTP status, EC2 error code).
    faults: Mutex<HashMap<String, (u32, u16, String)>>,
}

/// A recording, fault-injecting HTTP proxy in front of moto, and the
/// per-instance metadata endpoints: all on one background runtime.
pub struct Ec2Proxy {
    pub url: String,
    state: Arc<ProxyState>,
    /// The load balancers of the moto behind this proxy.
    pub elb: ElbDataPlane,
    rt: tokio::runtime::Runtime,
}

impl Ec2Proxy {
    pub fn start(upstream: &str) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let state = Arc::new(ProxyState {
            upstream: upstream.trim_end_matches('/').to_owned(),
            client: reqwest::Client::builder()
                .tls_backend_preconfigured(tls)
                .no_proxy()
                .build()
                .unwrap(),
            calls: Default::default(),
            faults: Default::default(),
        });
        let app = axum::Router::new()
            .fallback(forward)
            .with_state(state.clone());
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        rt.spawn(async move { axum::serve(listener, app).await });
        let elb = ElbDataPlane::start(&rt, upstream);
        Self {
            url,
            state,
            elb,
            rt,
        }
    }

    /// Every call of `action` so far, oldest first.
    pub fn calls(&self, action: &str) -> Vec<Call> {
        self.state
            .calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.action == action)
            .cloned()
            .collect()
    }

    /// The action of every call so far, oldest first.
    pub fn actions(&self) -> Vec<String> {
        self.state
            .calls
            .lock()
            .unwrap()
            .iter()
            .map(|c| c.action.clone())
            .collect()
    }

    /// Answers the next `count` calls of `action` with an EC2 error.
    pub fn fail_next(&self, action: &str, count: u32, status: u16, code: &str) {
        self.state
            .faults
            .lock()
            .unwrap()
            .insert(action.to_owned(), (count, status, code.to_owned()));
    }

    /// Serves IMDSv2 for one instance: `PUT /latest/api/token` (the TTL
    /// header required), then `GET /latest/user-data` and
    /// `GET /latest/meta-data/instance-id` with that token. Returns its URL.
    pub fn imds(&self, instance_id: &str, user_data: &str) -> String {
        let token = format!("token-{instance_id}");
        let state = Arc::new((token, instance_id.to_owned(), user_data.to_owned()));
        let app = axum::Router::new().fallback(imds).with_state(state);
        let listener = self
            .rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        self.rt
            .spawn(async move { axum::serve(listener, app).await });
        url
    }
}

async fn forward(
    axum::extract::State(state): axum::extract::State<Arc<ProxyState>>,
    method: http::Method,
    uri: http::Uri,
    headers: http::HeaderMap,
    body: axum::body::Bytes,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let params: BTreeMap<String, String> = form_urlencoded::parse(&body).into_owned().collect();
    let action = params.get("Action").cloned().unwrap_or_default();
    state.calls.lock().unwrap().push(Call {
        action: action.clone(),
        params,
    });
    {
        let mut faults = state.faults.lock().unwrap();
        if let Some((left, status, code)) = faults.get_mut(&action) {
            if *left > 0 {
                *left -= 1;
                let body = format!(
                    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{code}</Code><Message>injected by the test proxy</Message></Error></Errors><RequestID>test-proxy</RequestID></Response>"
                );
                return (
                    http::StatusCode::from_u16(*status).unwrap(),
                    [("content-type", "text/xml")],
                    body,
                )
                    .into_response();
            }
        }
    }
    let mut req = state.client.request(
        method,
        format!(
            "{}{}",
            state.upstream,
            uri.path_and_query().map(|p| p.as_str()).unwrap_or("/")
        ),
    );
    for (k, v) in &headers {
        if k != http::header::HOST && k != http::header::CONTENT_LENGTH {
            req = req.header(k, v);
        }
    }
    match req.body(body).send().await {
        Ok(r) => {
            let status = r.status();
            let ct = r
                .headers()
                .get("content-type")
                .cloned()
                .unwrap_or(http::HeaderValue::from_static("text/xml"));
            let bytes = r.bytes().await.unwrap_or_default();
            (status, [(http::header::CONTENT_TYPE, ct)], bytes).into_response()
        }
        Err(e) => (http::StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    }
}

async fn imds(
    axum::extract::State(state): axum::extract::State<Arc<(String, String, String)>>,
    method: http::Method,
    uri: http::Uri,
    headers: http::HeaderMap,
) -> (http::StatusCode, String) {
    let (token, instance_id, user_data) = &*state;
    if method == http::Method::PUT && uri.path() == "/latest/api/token" {
        if headers
            .get("x-aws-ec2-metadata-token-ttl-seconds")
            .is_none()
        {
            return (http::StatusCode::BAD_REQUEST, "missing TTL header".into());
        }
        return (http::StatusCode::OK, token.clone());
    }
    if headers
        .get("x-aws-ec2-metadata-token")
        .and_then(|v| v.to_str().ok())
        != Some(token.as_str())
    {
        return (http::StatusCode::UNAUTHORIZED, String::new());
    }
    match (method, uri.path()) {
        (http::Method::GET, "/latest/user-data") => (http::StatusCode::OK, user_data.clone()),
        (http::Method::GET, "/latest/meta-data/instance-id") => {
            (http::StatusCode::OK, instance_id.clone())
        }
        _ => (http::StatusCode::NOT_FOUND, String::new()),
    }
}

/// An instance as the test sees it.
#[derive(Debug, Clone)]
pub struct TestInstance {
    pub id: String,
    pub state: String,
    pub tags: BTreeMap<String, String>,
    pub subnet: String,
    pub image: String,
}

/// The test's own EC2 client, straight to moto.
pub struct Ec2 {
    client: aws_sdk_ec2::Client,
    rt: tokio::runtime::Runtime,
}

impl Ec2 {
    pub fn new(endpoint: &str) -> Self {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        Self {
            client: aws_sdk_ec2::Client::new(&sdk_config(endpoint)),
            rt,
        }
    }

    /// The environment that points a coordinator's SDK at `endpoint`.
    pub fn coordinator_env(endpoint: &str) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT_URL", endpoint),
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_EC2_METADATA_DISABLED", "true"),
            ("AWS_CONFIG_FILE", "/dev/null"),
            ("AWS_SHARED_CREDENTIALS_FILE", "/dev/null"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    /// An AMI moto knows.
    pub fn some_ami(&self) -> String {
        self.rt.block_on(async {
            let out = self.client.describe_images().send().await.unwrap();
            let ids = sorted(out.images().iter().filter_map(|i| i.image_id()));
            ids.into_iter().next().expect("moto has AMIs")
        })
    }

    /// The default VPC's subnets, sorted.
    pub fn default_subnets(&self) -> Vec<String> {
        self.rt.block_on(async {
            let out = self
                .client
                .describe_subnets()
                .filters(filter("default-for-az", "true"))
                .send()
                .await
                .unwrap();
            sorted(out.subnets().iter().filter_map(|s| s.subnet_id()))
        })
    }

    /// A new security group in the default VPC.
    pub fn security_group(&self, name: &str) -> String {
        self.rt.block_on(async {
            self.client
                .create_security_group()
                .group_name(name)
                .description("drover test nodes")
                .send()
                .await
                .unwrap()
                .group_id()
                .unwrap()
                .to_owned()
        })
    }

    /// Every instance tagged with `drover.dev/cluster=<cluster>`.
    pub fn instances(&self, cluster: &str) -> Vec<TestInstance> {
        self.rt.block_on(async {
            let out = self
                .client
                .describe_instances()
                .filters(filter("tag:drover.dev/cluster", cluster))
                .send()
                .await
                .unwrap();
            out.reservations()
                .iter()
                .flat_map(|r| r.instances())
                .map(|i| TestInstance {
                    id: i.instance_id().unwrap_or_default().to_owned(),
                    state: i
                        .state()
                        .and_then(|s| s.name())
                        .map(|n| n.as_str().to_owned())
                        .unwrap_or_default(),
                    tags: i
                        .tags()
                        .iter()
                        .map(|t| {
                            (
                                t.key().unwrap_or_default().to_owned(),
                                t.value().unwrap_or_default().to_owned(),
                            )
                        })
                        .collect(),
                    subnet: i.subnet_id().unwrap_or_default().to_owned(),
                    image: i.image_id().unwrap_or_default().to_owned(),
                })
                .collect()
        })
    }

    /// The instances of a cluster that are not terminated.
    pub fn live_instances(&self, cluster: &str) -> Vec<TestInstance> {
        self.instances(cluster)
            .into_iter()
            .filter(|i| i.state != InstanceStateName::Terminated.as_str())
            .collect()
    }

    /// An instance's user data, decoded.
    pub fn user_data(&self, instance_id: &str) -> String {
        self.rt.block_on(async {
            let out = self
                .client
                .describe_instance_attribute()
                .instance_id(instance_id)
                .attribute(InstanceAttributeName::UserData)
                .send()
                .await
                .unwrap();
            let b64 = out
                .user_data()
                .and_then(|u| u.value())
                .unwrap_or_default()
                .to_owned();
            String::from_utf8(
                base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .unwrap(),
            )
            .unwrap()
        })
    }

    /// Terminates an instance behind the coordinator's back.
    pub fn terminate(&self, instance_id: &str) {
        self.rt.block_on(async {
            self.client
                .terminate_instances()
                .instance_ids(instance_id)
                .send()
                .await
                .unwrap();
        });
    }

    /// Launches an instance tagged as if this coordinator had made it for
    /// a machine the store does not know (an orphan).
    pub fn launch_orphan(
        &self,
        ami: &str,
        subnet: &str,
        tags: &BTreeMap<String, String>,
    ) -> String {
        use aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification};
        self.rt.block_on(async {
            let out = self
                .client
                .run_instances()
                .image_id(ami)
                .instance_type(aws_sdk_ec2::types::InstanceType::T3Micro)
                .min_count(1)
                .max_count(1)
                .subnet_id(subnet)
                .tag_specifications(
                    TagSpecification::builder()
                        .resource_type(ResourceType::Instance)
                        .set_tags(Some(
                            tags.iter()
                                .map(|(k, v)| Tag::builder().key(k).value(v).build())
                                .collect(),
                        ))
                        .build(),
                )
                .send()
                .await
                .unwrap();
            out.instances()[0].instance_id().unwrap().to_owned()
        })
    }
}

/// Where a test cluster's instances go: an AMI moto knows, two default
/// subnets and a security group.
#[derive(Debug, Clone)]
pub struct Placement {
    pub ami: String,
    pub subnets: Vec<String>,
    pub sg: String,
}

impl Placement {
    pub fn new(ec2: &Ec2, sg_name: &str) -> Self {
        let subnets = ec2.default_subnets();
        assert!(subnets.len() >= 2, "moto's default VPC has {subnets:?}");
        Self {
            ami: ec2.some_ami(),
            subnets,
            sg: ec2.security_group(sg_name),
        }
    }

    /// A cluster of one control plane and `workers` in pool `default`, on
    /// `ami` (the placement's unless given). `maxUnhealthy` is 50 %: the
    /// default 40 % rounds down to no replacement at all in a pool of two,
    /// and the tests replace one of two workers.
    pub fn cluster_yaml(&self, name: &str, workers: u32, ami: Option<&str>) -> String {
        self.cluster_yaml_with(name, 1, workers, ami)
    }

    /// [`Placement::cluster_yaml`] with `cp` control planes.
    pub fn cluster_yaml_with(
        &self,
        name: &str,
        cp: u32,
        workers: u32,
        ami: Option<&str>,
    ) -> String {
        crate::cluster_yaml(
            name,
            cp,
            workers,
            &format!(
                "    aws:
      region: {REGION}
      tags:
        team: infra
      controlPlane:
        ami: {ami}
        instanceType: m6i.large
        subnets: [{s0}]
        securityGroups: [{sg}]
      workerPools:
        default:
          ami: {ami}
          instanceType: t3.medium
          subnets: [{s0}, {s1}]
          securityGroups: [{sg}]
          tags:
            team: apps
  health:
    maxUnhealthy: 50%
",
                ami = ami.unwrap_or(&self.ami),
                s0 = self.subnets[0],
                s1 = self.subnets[1],
                sg = self.sg,
            ),
        )
    }
}

/// Plays the boot of every live instance of `cluster` that has no agent in
/// `agents` yet: an agent rooted under `dir` reading the instance's own user
/// data and ID from its IMDSv2.
pub fn boot_new_instances(
    ec2: &Ec2,
    proxy: &Ec2Proxy,
    dir: &std::path::Path,
    cluster: &str,
    agents: &mut BTreeMap<String, crate::Agent>,
) {
    for i in ec2.live_instances(cluster) {
        if agents.contains_key(&i.id) {
            continue;
        }
        let imds = proxy.imds(&i.id, &ec2.user_data(&i.id));
        let agent = crate::Agent::boot_with_env(
            &dir.join(&i.id),
            &i.tags["drover.dev/machine"],
            crate::Boot::Imds(imds),
            vec![proxy.elb.resolve_env()],
        );
        agents.insert(i.id.clone(), agent);
    }
}

/// What moto does not emulate of a Network Load Balancer: its traffic. For
/// every load balancer moto knows, this listens on a loopback address of its
/// own, port 6443, and forwards each connection to the targets registered in
/// the group its listener forwards to (re-read every 200 ms), round robin,
/// skipping a target that does not accept. Machines reach a load balancer's
/// DNS name (which resolves nowhere here) through [`ElbDataPlane::resolve_env`].
pub struct ElbDataPlane {
    client: aws_sdk_elasticloadbalancingv2::Client,
    handle: tokio::runtime::Handle,
    /// DNS name -> (its loopback address, its targets).
    served: Arc<Mutex<BTreeMap<String, (std::net::IpAddr, drover_common::tcp_proxy::Backends)>>>,
}

/// The port of every test load balancer's listener.
pub const ELB_PORT: u16 = 6443;

impl ElbDataPlane {
    fn start(rt: &tokio::runtime::Runtime, moto: &str) -> Self {
        let plane = Self {
            client: aws_sdk_elasticloadbalancingv2::Client::new(&sdk_config(moto)),
            handle: rt.handle().clone(),
            served: Default::default(),
        };
        let (client, served) = (plane.client.clone(), plane.served.clone());
        rt.spawn(async move {
            loop {
                if let Err(e) = refresh(&client, &served).await {
                    eprintln!("elb data plane: {e}");
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        plane
    }

    /// `DROVER_STANDIN_RESOLVE` for a machine: every load balancer moto
    /// knows now, by DNS name, at its loopback address.
    pub fn resolve_env(&self) -> (String, String) {
        let (client, served) = (self.client.clone(), self.served.clone());
        self.handle
            .block_on(async move { refresh(&client, &served).await })
            .unwrap();
        let value = self
            .served
            .lock()
            .unwrap()
            .iter()
            .map(|(dns, (ip, _))| format!("{dns}={ip}"))
            .collect::<Vec<_>>()
            .join(",");
        ("DROVER_STANDIN_RESOLVE".to_owned(), value)
    }

    /// Where the load balancer named `dns` is served, `ip:6443`.
    pub fn address(&self, dns: &str) -> Option<std::net::SocketAddr> {
        self.served
            .lock()
            .unwrap()
            .get(dns)
            .map(|(ip, _)| std::net::SocketAddr::new(*ip, ELB_PORT))
    }

    /// The targets registered in a group, as addresses, sorted.
    pub fn targets(&self, tg: &str) -> Result<Vec<std::net::SocketAddr>, String> {
        let client = self.client.clone();
        let tg = tg.to_owned();
        self.handle
            .block_on(async move { registered(&client, &tg).await })
    }

    /// The test's own client of moto's ELBv2 API.
    pub fn client(&self) -> &aws_sdk_elasticloadbalancingv2::Client {
        &self.client
    }

    /// Runs `f` on the data plane's runtime.
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.handle.block_on(f)
    }
}

/// Serves every load balancer moto knows and points each at its targets.
async fn refresh(
    client: &aws_sdk_elasticloadbalancingv2::Client,
    served: &Mutex<BTreeMap<String, (std::net::IpAddr, drover_common::tcp_proxy::Backends)>>,
) -> Result<(), String> {
    let lbs = client
        .describe_load_balancers()
        .send()
        .await
        .map_err(|e| format!("DescribeLoadBalancers: {e:?}"))?;
    for lb in lbs.load_balancers() {
        let (Some(dns), Some(arn)) = (lb.dns_name(), lb.load_balancer_arn()) else {
            continue;
        };
        let backends = {
            let mut served = served.lock().unwrap();
            if !served.contains_key(dns) {
                let ip: std::net::IpAddr = crate::free_loopback().parse().unwrap();
                let listener = std::net::TcpListener::bind((ip, ELB_PORT))
                    .map_err(|e| format!("bind {ip}:{ELB_PORT}: {e}"))?;
                listener.set_nonblocking(true).unwrap();
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let backends = drover_common::tcp_proxy::Backends::default();
                tokio::spawn(drover_common::tcp_proxy::accept_loop(
                    listener,
                    dns.to_owned(),
                    backends.clone(),
                    std::sync::Arc::new(drover_common::tcp_proxy::Admission::new(
                        Default::default(),
                        None,
                    )),
                ));
                served.insert(dns.to_owned(), (ip, backends));
            }
            served[dns].1.clone()
        };
        let listeners = client
            .describe_listeners()
            .load_balancer_arn(arn)
            .send()
            .await
            .map_err(|e| format!("DescribeListeners: {e:?}"))?;
        let groups: Vec<String> = listeners
            .listeners()
            .iter()
            .flat_map(|l| l.default_actions())
            .filter_map(|a| a.target_group_arn().map(str::to_owned))
            .collect();
        let mut targets = vec![];
        for tg in groups {
            targets.extend(registered(client, &tg).await?);
        }
        targets.sort();
        *backends.write().unwrap() = targets;
    }
    Ok(())
}

/// The targets registered in a group, as addresses, sorted.
async fn registered(
    client: &aws_sdk_elasticloadbalancingv2::Client,
    tg: &str,
) -> Result<Vec<std::net::SocketAddr>, String> {
    let health = client.describe_target_health().target_group_arn(tg);
    let health = health
        .send()
        .await
        .map_err(|e| format!("DescribeTargetHealth: {e:?}"))?;
    let mut out: Vec<std::net::SocketAddr> = health
        .target_health_descriptions()
        .iter()
        .filter_map(|d| {
            let t = d.target()?;
            let ip: std::net::IpAddr = t.id()?.parse().ok()?;
            Some(std::net::SocketAddr::new(ip, t.port()? as u16))
        })
        .collect();
    out.sort();
    Ok(out)
}

/// The ids, owned and sorted.
fn sorted<'a>(ids: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut v: Vec<String> = ids.map(str::to_owned).collect();
    v.sort();
    v
}

/// An EC2 filter on one name and value.
fn filter(name: &str, value: &str) -> Filter {
    Filter::builder().name(name).values(value).build()
}
