"""shipper: tail log files, parse them, queue them durably and ship them to Elasticsearch exactly once."""

__version__ = "0.1.0"
