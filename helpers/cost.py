"""What a training job can cost, said before it is launched.

SageMaker bills training per second of instance time: ``price/hour x instance count x
hours``. ``max_run`` (``StoppingCondition.MaxRuntimeInSeconds``) caps the hours, so
``price x count x max_run`` is the most an on-demand job can cost. A managed spot job is
billed at the spot rate for its billable seconds, which can never exceed ``max_run`` and
the on-demand rate, so the same figure is its ceiling; ``max_wait`` bounds the waiting
for capacity, which is not billed.

Prices come from a dated table (below) unless the AWS Pricing API answers with
today's figure. The Pricing API needs credentials; it is asked with short timeouts and one
attempt, and any failure falls back to the table with a message, never a hang.
"""

from __future__ import annotations

from dataclasses import dataclass

# SageMaker training, on-demand USD per instance-hour, us-east-1.
# Approximate: taken from the public SageMaker pricing page as of PRICE_TABLE_DATE.
# AWS lowered P4/P5 prices in mid-2025; the Pricing API refresh gives the current figure.
PRICE_TABLE_DATE = "2025-05-01"
PRICE_TABLE_REGION = "us-east-1"
ON_DEMAND_USD_PER_HOUR = {
    # 8 x H200 141 GB
    "ml.p5e.48xlarge": 124.42,
    "ml.p5en.48xlarge": 124.42,
    # 8 x H100 80 GB
    "ml.p5.48xlarge": 113.07,
    # 8 x A100 80 GB / 40 GB
    "ml.p4de.24xlarge": 47.11,
    "ml.p4d.24xlarge": 37.69,
    # 8 / 1 x V100
    "ml.p3.16xlarge": 28.15,
    "ml.p3.2xlarge": 3.83,
    # A10G (g5), L4 (g6), L40S (g6e)
    "ml.g5.xlarge": 1.41,
    "ml.g5.2xlarge": 1.52,
    "ml.g5.12xlarge": 7.09,
    "ml.g5.24xlarge": 10.18,
    "ml.g5.48xlarge": 20.36,
    "ml.g6.xlarge": 1.01,
    "ml.g6.2xlarge": 1.22,
    "ml.g6.12xlarge": 5.75,
    "ml.g6.48xlarge": 16.70,
    "ml.g6e.xlarge": 2.26,
    "ml.g6e.12xlarge": 13.12,
    "ml.g6e.48xlarge": 37.67,
    # Trainium
    "ml.trn1.32xlarge": 24.72,
    # CPU
    "ml.m5.xlarge": 0.23,
    "ml.m5.2xlarge": 0.46,
    "ml.c5.2xlarge": 0.41,
    # CPU, 64 vCPUs (code RL's judges), as of 2025-05-01, us-east-1: EC2's on-demand c7i.16xlarge
    # ($2.856/h) x 1.2, the SageMaker training markup the c5 and m5 rows above have over EC2.
    # Approximate; the Pricing API refresh gives the listed figure.
    "ml.c7i.16xlarge": 3.43,
}
# Illustrative only: managed spot typically saves this fraction; the real figure is
# reported per job after it ends (BillableTimeInSeconds vs TrainingTimeInSeconds).
TYPICAL_SPOT_SAVINGS = (0.6, 0.9)

_PRICING_API_REGION = "us-east-1"  # the Pricing API lives in a few regions only; us-east-1 is one


@dataclass
class Price:
    usd_per_hour: float
    source: str  # where the figure comes from, said next to it


@dataclass(repr=False)
class CostEstimate:
    instance_type: str
    instance_count: int
    max_run_seconds: int
    use_spot: bool
    max_wait_seconds: int | None
    price: Price

    @property
    def hours(self) -> float:
        return self.max_run_seconds / 3600

    @property
    def on_demand_ceiling(self) -> float:
        return self.price.usd_per_hour * self.instance_count * self.hours

    @property
    def spot_range(self) -> tuple[float, float]:
        low, high = TYPICAL_SPOT_SAVINGS
        return self.on_demand_ceiling * (1 - high), self.on_demand_ceiling * (1 - low)

    def lines(self) -> list[str]:
        rate = self.price.usd_per_hour
        out = [
            f"{self.instance_count} x {self.instance_type} at ${rate:,.2f}/h ({self.price.source})",
            f"on-demand, at most: ${rate:,.2f} x {self.instance_count} x {self.hours:.2f} h (max_run) "
            f"= ${self.on_demand_ceiling:,.2f}",
            f"per hour actually run: ${rate * self.instance_count:,.2f}",
        ]
        if self.use_spot:
            low, high = self.spot_range
            wait = (
                f"; max_wait {self.max_wait_seconds / 3600:.2f} h of waiting is not billed"
                if self.max_wait_seconds
                else ""
            )
            out.append(
                f"managed spot: ceiling ${self.on_demand_ceiling:,.2f} (billable time <= max_run, "
                f"rate <= on-demand){wait}; typically ${low:,.2f}-${high:,.2f} "
                f"(illustrative {TYPICAL_SPOT_SAVINGS[0]:.0%}-{TYPICAL_SPOT_SAVINGS[1]:.0%} savings)"
            )
        return out

    def __str__(self) -> str:
        return "Cost estimate\n  " + "\n  ".join(self.lines())

    __repr__ = __str__  # what a notebook without Markdown rendering (papermill's text) shows

    def _repr_markdown_(self) -> str:
        return "**Cost estimate**\n\n" + "\n".join(f"- {line}" for line in self.lines())


def table_price(instance_type: str) -> Price:
    try:
        rate = ON_DEMAND_USD_PER_HOUR[instance_type]
    except KeyError:
        known = ", ".join(sorted(ON_DEMAND_USD_PER_HOUR))
        raise KeyError(
            f"No price for {instance_type!r} in helpers/cost.py (known: {known}). "
            f"Add it to ON_DEMAND_USD_PER_HOUR with its date and source."
        ) from None
    return Price(rate, f"price table of {PRICE_TABLE_DATE}, {PRICE_TABLE_REGION}, approximate")


def pricing_api_price(instance_type: str, region: str, boto_session=None, timeout: float = 4.0) -> float:
    """Today's on-demand training price from the AWS Pricing API (raises on any failure)."""
    import json

    import boto3
    from botocore.config import Config

    session = boto_session or boto3.Session()
    client = session.client(
        "pricing",
        region_name=_PRICING_API_REGION,
        config=Config(connect_timeout=timeout, read_timeout=timeout, retries={"max_attempts": 1, "mode": "standard"}),
    )
    response = client.get_products(
        ServiceCode="AmazonSageMaker",
        Filters=[
            {"Type": "TERM_MATCH", "Field": field, "Value": value}
            for field, value in (("instanceName", instance_type), ("regionCode", region), ("component", "Training"))
        ],
        MaxResults=20,
    )
    for item in map(json.loads, response["PriceList"]):
        if "spot" in item["product"]["attributes"].get("usagetype", "").lower():
            continue
        for term in item.get("terms", {}).get("OnDemand", {}).values():
            for dimension in term["priceDimensions"].values():
                usd = float(dimension["pricePerUnit"].get("USD", 0))
                if usd > 0:
                    return usd
    raise LookupError(f"the Pricing API lists no on-demand training price for {instance_type} in {region}")


def price_for(
    instance_type: str, region: str = PRICE_TABLE_REGION, *, ask_pricing_api: bool = True, boto_session=None
) -> Price:
    """The Pricing API's figure when it answers, else the dated table's (with the reason)."""
    fallback = table_price(instance_type) if instance_type in ON_DEMAND_USD_PER_HOUR else None
    if not ask_pricing_api:
        if fallback is None:
            table_price(instance_type)  # raises the helpful KeyError
        return fallback
    try:
        usd = pricing_api_price(instance_type, region, boto_session=boto_session)
        return Price(usd, f"AWS Pricing API, {region}, today")
    except Exception as error:  # no credentials, no network, access denied, throttled...
        if fallback is None:
            raise KeyError(
                f"No price for {instance_type}: the Pricing API did not answer "
                f"({type(error).__name__}) and the table has no entry."
            ) from error
        reason = str(error).splitlines()[0][:120]
        fallback.source += f"; Pricing API not used: {type(error).__name__}: {reason}"
        if region != PRICE_TABLE_REGION:
            fallback.source += f"; prices in {region} may differ"
        return fallback


@dataclass(repr=False)
class ClusterCost:
    """One job's instances, group by group, for ``max_run_seconds``: ``[(group, type, count, price)]``."""

    name: str
    groups: list[tuple[str, str, int, Price]]
    max_run_seconds: int

    @property
    def usd_per_hour(self) -> float:
        return sum(price.usd_per_hour * count for _, _, count, price in self.groups)

    @property
    def on_demand_ceiling(self) -> float:
        return self.usd_per_hour * self.max_run_seconds / 3600


@dataclass(repr=False)
class ClusterComparison:
    """Clusters for the same run side by side (same ``max_run``: the hours each may bill)."""

    clusters: list[ClusterCost]

    def lines(self) -> list[str]:
        out = []
        for cluster in self.clusters:
            parts = " + ".join(
                f"{count} x {kind} ({group}, ${price.usd_per_hour:,.2f}/h)"
                for group, kind, count, price in cluster.groups
            )
            out.append(
                f"{cluster.name}: {parts} = ${cluster.usd_per_hour:,.2f}/h; "
                f"at most ${cluster.on_demand_ceiling:,.2f} for {cluster.max_run_seconds / 3600:.2f} h (max_run)"
            )
        if len(self.clusters) > 1:
            cheapest = min(self.clusters, key=lambda c: c.usd_per_hour)
            dearest = max(self.clusters, key=lambda c: c.usd_per_hour)
            out.append(
                f"{cheapest.name} costs {cheapest.usd_per_hour / dearest.usd_per_hour:.0%} of {dearest.name} "
                f"per hour (saves ${dearest.on_demand_ceiling - cheapest.on_demand_ceiling:,.2f} at max_run)"
            )
        sources = sorted({price.source for cluster in self.clusters for *_, price in cluster.groups})
        out.append("prices: " + "; ".join(sources))
        return out

    def __str__(self) -> str:
        return "Cost of each cluster\n  " + "\n  ".join(self.lines())

    __repr__ = __str__

    def _repr_markdown_(self) -> str:
        return "**Cost of each cluster**\n\n" + "\n".join(f"- {line}" for line in self.lines())


def compare_clusters(
    clusters: dict[str, list[tuple[str, str, int]]],
    max_run_seconds: int,
    *,
    region: str = PRICE_TABLE_REGION,
    ask_pricing_api: bool = True,
    boto_session=None,
) -> ClusterComparison:
    """The cost of each cluster for the same run. ``clusters``: ``{name: [(group, instance type, count)]}``,
    a plain cluster being one group. The run takes the same hours on each (``max_run_seconds``)."""
    if max_run_seconds <= 0:
        raise ValueError(f"max_run_seconds must be positive, got {max_run_seconds}")
    prices: dict[str, Price] = {}
    costs = []
    for name, groups in clusters.items():
        if not groups or any(count < 1 for _, _, count in groups):
            raise ValueError(f"cluster {name!r} needs groups of at least one instance each, got {groups}")
        for _, kind, _ in groups:
            if kind not in prices:
                prices[kind] = price_for(kind, region, ask_pricing_api=ask_pricing_api, boto_session=boto_session)
        costs.append(
            ClusterCost(name, [(group, kind, count, prices[kind]) for group, kind, count in groups], max_run_seconds)
        )
    return ClusterComparison(costs)


def estimate(
    instance_type: str,
    instance_count: int = 1,
    max_run_seconds: int = 24 * 3600,
    *,
    use_spot: bool = False,
    max_wait_seconds: int | None = None,
    region: str = PRICE_TABLE_REGION,
    ask_pricing_api: bool = True,
    boto_session=None,
) -> CostEstimate:
    """Cost estimate for one training job; display it in a notebook or ``print`` it."""
    if instance_count < 1:
        raise ValueError(f"instance_count must be at least 1, got {instance_count}")
    if max_run_seconds <= 0:
        raise ValueError(f"max_run_seconds must be positive, got {max_run_seconds}")
    price = price_for(instance_type, region, ask_pricing_api=ask_pricing_api, boto_session=boto_session)
    return CostEstimate(instance_type, instance_count, max_run_seconds, use_spot, max_wait_seconds, price)
