//! portwise's operations port: a plain HTTP GET and the Prometheus text
//! `/metrics` answers, parsed.

use std::{collections::BTreeMap, net::SocketAddr, time::Duration};

use anyhow::{Context, Result, bail};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

/// A plain HTTP/1.1 GET: (status, body).
pub async fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let mut s = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr))
        .await
        .with_context(|| format!("connecting to {addr}"))?
        .with_context(|| format!("connecting to {addr}"))?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf)).await??;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("no HTTP response from {addr}{path}: {text:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no status line: {head:?}"))?;
    Ok((status, body.to_string()))
}

/// One sample: metric name, labels, value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed scrape.
#[derive(Clone, Debug, Default)]
pub struct Metrics(pub Vec<Sample>);

impl Metrics {
    /// Parses the Prometheus / OpenMetrics text format (comments skipped;
    /// label values without escaped quotes, which ours never hold).
    pub fn parse(text: &str) -> Self {
        let mut out = Vec::new();
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let (series, value) = match line.rsplit_once(' ') {
                Some(x) => x,
                None => continue,
            };
            let Ok(value) = value.trim().parse::<f64>() else {
                continue;
            };
            let (name, labels) = match series.split_once('{') {
                None => (series.to_string(), BTreeMap::new()),
                Some((name, rest)) => {
                    let rest = rest.trim_end_matches('}');
                    let labels = rest
                        .split("\",")
                        .filter(|kv| !kv.is_empty())
                        .filter_map(|kv| {
                            let (k, v) = kv.split_once("=\"")?;
                            Some((k.to_string(), v.trim_end_matches('"').to_string()))
                        })
                        .collect();
                    (name.to_string(), labels)
                }
            };
            out.push(Sample {
                name,
                labels,
                value,
            });
        }
        Self(out)
    }

    /// Samples of `name` whose labels include all of `labels`.
    pub fn select<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.0.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }

    /// The one sample of `name` with `labels`; `None` if absent, an error if
    /// several match.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Result<Option<f64>> {
        let found: Vec<&Sample> = self.select(name, labels).collect();
        match found.as_slice() {
            [] => Ok(None),
            [one] => Ok(Some(one.value)),
            many => bail!("{} samples of {name}{labels:?}: {many:?}", many.len()),
        }
    }

    /// The sum of every sample of `name` with `labels` (0 when none).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.select(name, labels).map(|s| s.value).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_openmetrics_text() {
        let m = Metrics::parse(
            "# HELP portwise_leader x\n# TYPE portwise_leader gauge\nportwise_leader 1\n\
             portwise_endpoints_published{namespace=\"n\",service=\"s\",port=\"http\",family=\"IPv4\"} 3\n\
             portwise_writes_total{kind=\"apply\"} 7\nportwise_writes_total{kind=\"delete\"} 1\n# EOF\n",
        );
        assert_eq!(m.value("portwise_leader", &[]).unwrap(), Some(1.0));
        assert_eq!(
            m.value(
                "portwise_endpoints_published",
                &[("service", "s"), ("port", "http"), ("family", "IPv4")]
            )
            .unwrap(),
            Some(3.0)
        );
        assert_eq!(m.sum("portwise_writes_total", &[]), 8.0);
        assert!(m.value("portwise_writes_total", &[]).is_err());
    }
}
