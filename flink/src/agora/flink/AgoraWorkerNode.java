package agora.flink;

import org.apache.flink.runtime.clusterframework.types.ResourceID;
import org.apache.flink.runtime.clusterframework.types.ResourceIDRetrievable;

/** A TaskManager running as an Agora task: its worker id is its Flink resource id. */
public final class AgoraWorkerNode implements ResourceIDRetrievable {
    private final ResourceID resourceId;
    private final String hostname;
    private final String agentId;
    private final String locality;

    AgoraWorkerNode(String workerId, String hostname, String agentId, String locality) {
        this.resourceId = new ResourceID(workerId);
        this.hostname = hostname;
        this.agentId = agentId;
        this.locality = locality;
    }

    @Override
    public ResourceID getResourceID() {
        return resourceId;
    }

    /** The agent's host name. */
    public String getHostname() {
        return hostname;
    }

    /** The Agora agent it runs on. */
    public String getAgentId() {
        return agentId;
    }

    /** How close to its preference it was placed: local, host, rack or any. */
    public String getLocality() {
        return locality;
    }

    @Override
    public String toString() {
        return resourceId + " on " + hostname + " (" + locality + ")";
    }
}
